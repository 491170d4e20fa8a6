"""Full prefill and decoding through the adapter equal the adapted library's own model (fp32, CPU):
mlx-lm's on MLX, transformers' on torch."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.adapted import AdaptedArgs, checked_terms
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


def test_checked_terms_refuses_sinks_not_one_per_head_of_the_libraries_array_and_a_bad_softcap():
    sinks = np.zeros(4, dtype=np.float32)
    terms, refusal = checked_terms(sinks, 30, 4, np.ndarray)
    assert refusal is None and terms is not None and terms.sinks is sinks and terms.softcap == 30.0
    assert checked_terms(None, None, 4, np.ndarray) == (None, None)
    assert "of shape (3,)" in checked_terms(np.zeros(3), None, 4, np.ndarray)[1]
    assert "held as list" in checked_terms([0.0] * 4, None, 4, np.ndarray)[1]
    for softcap in (0, -1.0, True, "30"):
        assert "soft-cap" in checked_terms(None, softcap, 4, np.ndarray)[1]
