"""Text units through the one generation path (issue 47 item 3): a Session on each backend fills
the prompt's unit starts from its tokenizer (generation.stream_request) and the model keeps exactly
what the NumPy reference selects from the reference speculator over those units."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from specfill.api import Session
from specfill.core.config import SpecPrefillConfig
from specfill.core.io.tokenizer import Tokenizer
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import GenerationInfo
from specfill.core.text_units import with_text_units_config
from tests.methods.support import prompt, reference_speculator


def _tokenizer(vocab_size: int) -> Tokenizer:
    """Word-level ids as text, with id 7 a line break and id 13 a blank line (a paragraph's end)."""
    words = {str(i): i for i in range(vocab_size)}
    words["\n"], words["\n\n"] = words.pop("7"), words.pop("13")
    return Tokenizer(
        BackendTokenizer(models.WordLevel(words, unk_token="0")),
        bos_token_id=None,
        eos_token_ids=(),
        chat_template=None,
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_session_selects_whole_text_units(tiny, arch):
    t = tiny(arch)
    tokenizer = _tokenizer(t.args.vocab_size)
    ids = [int(i) for i in prompt(120, t.args.vocab_size, seed=5)]
    ids[20] = ids[41] = ids[77] = 13  # paragraph ends
    ids[30] = ids[60] = ids[95] = 7  # line ends
    config = SpecPrefillConfig(select_units="text", keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3)
    info = GenerationInfo()
    session = Session(t.model, tokenizer)
    list(
        session.stream(
            ids, max_tokens=1, method="specprefill", specprefill=config, speculator="self:1", prefill_info=info
        )
    )
    filled = with_text_units_config(config, tokenizer, ids)
    # units of at most 8 tokens: the 21-token paragraph [0, 21) cut every 8; the next paragraph's two
    # lines [21, 31) and [31, 42) each start a unit (neither fits the other's), each cut at 8
    assert filled.unit_starts[:8] == (0, 8, 16, 21, 29, 31, 39, 42)
    queries, keys, _ = reference_speculator(t.ref, ids, 1, 3)
    _, selection = speculative_selection(queries, keys, filled, t.ref.scale, REFERENCE)
    assert info.kept_positions == selection.kept.tolist()
    chunks = speculative_selection(
        queries, keys, replace(filled, select_units="chunks", unit_starts=()), t.ref.scale, REFERENCE
    )
    assert chunks[1].kept.tolist() != selection.kept.tolist()  # the units changed what is kept
