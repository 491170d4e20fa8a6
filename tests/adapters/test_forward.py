"""Full prefill and decoding through the adapter equal the adapted library's own model (fp32, CPU):
mlx-lm's on MLX, transformers' on torch."""

from __future__ import annotations

import pytest

from specfill.core.adapted import AdaptedArgs
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.adapters.support import assert_close, greedy, prompt


def test_the_set_covers_twelve_architectures_and_four_mixtures_of_experts(backend):
    assert len(backend.HONOURED) >= 12 and len([a for a in backend.MOE if a in backend.HONOURED]) >= 4


@pytest.mark.archs("honoured", "refused")
def test_full_prefill_equals_the_library_forward(backend, arch):
    """Every position's logits, in two prefill steps (the second step attends to the cache), over a
    prompt longer than the sliding windows (8) of the architectures that slide (mlx: gemma3_text,
    exaone4; torch: mixtral, starcoder2, exaone4, gpt_oss, gemma2)."""
    lm = backend.build(arch)
    ids = prompt(40, seed=1)
    want = backend.own_logits(lm, ids)
    model = backend.adapted(lm, prefill_step_size=24)
    assert isinstance(model.args, AdaptedArgs) and model.args.num_hidden_layers == 2
    got = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert_close(got, want, f"{arch} prefill")


@pytest.mark.archs("honoured", "refused")
def test_greedy_decoding_equals_the_library_with_its_own_cache(backend, arch):
    lm = backend.build(arch)
    ids = prompt(20, seed=2)
    want = backend.own_greedy(lm, ids, 6)
    assert greedy(backend.adapted(lm), ids, 6) == want
