"""Mistral (every layer slides) and Gemma 3 (sliding and global layers, q/k norms, sandwich
norms, scaled embeddings, GELU-tanh, its own query scale and local RoPE base) against
transformers' own models and against the NumPy reference's dense window mask."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specfill.core.methods.prefill import prefill
from specfill.core.reference.model import ReferenceModel
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

FAMILIES = ["mistral", "gemma3"]


@pytest.mark.parametrize("arch", FAMILIES)
def test_logits_match_transformers_past_the_window(arch):
    tiny = make_tiny(arch, seed=1)
    assert tiny.args.sliding_window == 8
    ids = prompt_ids(48, seed=1)  # six windows long
    hf = tiny.hf_logits(ids)
    assert (tiny.ours()(ids) - hf).abs().max().item() <= 1e-4
    assert np.abs(ReferenceModel(tiny.args, tiny.weights).forward(ids) - hf[0].numpy()).max() <= 1e-4
    # the window matters: ignoring it changes the logits past position 8
    unwindowed = ReferenceModel(dataclasses.replace(tiny.args, sliding_window=None), tiny.weights).forward(ids)
    assert np.abs(unwindowed - hf[0].numpy())[8:].max() > 1e-2


def test_gemma3_layer_kinds():
    args = make_tiny("gemma3").args
    assert [args.layer_window(i) for i in range(3)] == [8, None, 8]
    assert [args.local_rope(i) for i in range(3)] == [True, False, True]
    assert args.attention_scale == pytest.approx(20**-0.5) and args.embedding_scale == pytest.approx(8.0)
    assert args.rope_theta == 1e6 and args.rope_local_theta == 1e4 and args.tie_word_embeddings


@pytest.mark.parametrize("arch", FAMILIES)
def test_window_counts_original_positions_in_a_sparse_cache(arch):
    """Kept tokens in slots 0..K-1 at original positions (speculative prefill), then a decode:
    the window is over positions, checked against the reference's dense mask over positions."""
    tiny = make_tiny(arch, seed=3)
    ids = prompt_ids(12, seed=3)
    positions = [0, 1, 3, 6, 7, 9, 12, 15, 16, 20, 21, 30]  # gaps: 8 positions hold 2 to 5 slots
    reference = ReferenceModel(tiny.args, tiny.weights).forward(ids, positions)
    model = tiny.ours()
    ops = model.ops
    cache = ops.new_cache(model.model, 16)
    kept = prefill(
        ops, model.model, ops.tokens(np.array(ids[:11])), np.array(positions[:11]), cache, step_size=4, logits_from=0
    )
    decoded = ops.forward(model.model, ops.tokens(np.array([ids[11]])), 30, cache, None, 0)[-1]
    assert np.abs(kept.numpy() - reference[:11]).max() <= 1e-4
    assert np.abs(decoded.numpy() - reference[11]).max() <= 1e-4
    # counting slots instead of positions is a different model
    by_slot = ReferenceModel(tiny.args, tiny.weights).forward(ids)
    assert np.abs(by_slot[11] - reference[11]).max() > 1e-2


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_decode_past_the_window_matches_transformers_generate(arch):
    tiny = make_tiny(arch, seed=5)
    ids = prompt_ids(13, seed=5)
    expected = tiny.hf_greedy(ids, 10)
    tokens = list(
        tiny.ours(step=4).generate_step(
            ids,
            max_tokens=10,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )
    )
    assert tokens == expected
