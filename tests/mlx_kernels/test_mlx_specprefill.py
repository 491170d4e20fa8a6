"""Speculative-prefill scoring and selection on MLX (twins) against the NumPy reference."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx.specprefill import (chunk_means, reduce_scores, score_tokens, select_tokens,
                                               smooth_scores, speculative_selection)
from specfill.core import ConfigError, SpecPrefillConfig
from specfill.core.reference import REFERENCE
from specfill.core.reference import specprefill as ref

SCALE = 0.25


def captured(seed: int, n_layers: int, n_queries: int, n_heads: int, n_kv: int, prompt_len: int):
    rng = np.random.default_rng(seed)
    host = [rng.normal(size=(n_layers, n_queries, n_heads, 16)).astype(np.float32),
            rng.normal(size=(n_layers, n_kv, prompt_len, 16)).astype(np.float32)]
    return [mx.array(h) for h in host], [h.astype(np.float64) for h in host]


@pytest.mark.parametrize("config,prompt_len", [
    (SpecPrefillConfig(), 300),
    (SpecPrefillConfig(keep_ratio=0.3, select_chunk=8, pool_kernel=5, layers="last-2"), 101),
    (SpecPrefillConfig(keep_ratio=0.2, head_reduction="mean", layer_reduction="mean"), 150),
    (SpecPrefillConfig(keep_tokens=16, select_chunk=4, pool_kernel=1), 64),
    (SpecPrefillConfig(keep_ratio=0.5, pool_kernel=13), 5),  # prompt shorter than the pooling
])
def test_selection_matches_the_reference(config, prompt_len):
    (queries, keys), (qn, kn) = captured(prompt_len, 4, 3, 6, 2, prompt_len)
    scores, got = speculative_selection(queries, keys, config, SCALE, use_kernels=False)
    want_scores, want = ref.speculative_selection(qn, kn, config, SCALE, REFERENCE)
    np.testing.assert_allclose(np.array(scores.importance), want_scores.importance, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(np.array(scores.smoothed), want_scores.smoothed, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(np.array(got.chunk_scores), want.chunk_scores, atol=1e-6, rtol=1e-5)
    assert np.array(got.kept).tolist() == want.kept.tolist()
    assert np.array(got.position_ids).tolist() == want.kept.tolist()  # original positions
    assert got.decode_start == prompt_len


def test_keep_all_keeps_every_token_at_its_position():
    (queries, keys), _ = captured(1, 2, 2, 4, 2, 70)
    _, got = speculative_selection(queries, keys, SpecPrefillConfig(keep_ratio=1.0), SCALE, use_kernels=False)
    assert np.array(got.kept).tolist() == list(range(70)) and got.decode_start == 70


def test_ties_go_to_the_earlier_chunk_and_the_last_token_is_kept():
    got = select_tokens(mx.ones(100), SpecPrefillConfig(keep_ratio=0.3, select_chunk=10))
    assert np.array(got.kept).tolist() == list(range(30)) + [99]
    got = select_tokens(mx.ones(100), SpecPrefillConfig(keep_ratio=0.3, select_chunk=10, force_keep_last=False))
    assert np.array(got.kept).tolist() == list(range(30))


def test_a_cold_last_chunk_still_keeps_the_last_token():
    importance = mx.array(np.r_[np.linspace(1, 2, 95), np.zeros(5)].astype(np.float32))
    got = select_tokens(importance, SpecPrefillConfig(keep_ratio=0.2, select_chunk=10))
    # chunks 7 and 8 score highest; chunk 9 is diluted by its zeros, yet token 99 stays
    assert np.array(got.kept).tolist() == list(range(70, 90)) + [99]


def test_per_layer_lists_score_like_stacked_arrays():
    (queries, keys), _ = captured(2, 5, 3, 4, 2, 40)
    config = SpecPrefillConfig(layers="last-3", select_chunk=4)
    stacked = score_tokens(queries, keys, config, SCALE, use_kernels=False)
    listed = score_tokens([queries[i] for i in range(5)], [keys[i] for i in range(5)], config, SCALE,
                          use_kernels=False)
    assert stacked.probs.shape == (3, 3, 4, 40)
    np.testing.assert_array_equal(np.array(stacked.importance), np.array(listed.importance))


def test_smoothing_pads_with_zeros_and_divides_by_the_kernel():
    probs = mx.array([[1.0, 0.0, 0.0, 0.0, 2.0]])
    np.testing.assert_allclose(np.array(smooth_scores(probs, 3)), [[1 / 3, 1 / 3, 0, 2 / 3, 2 / 3]], rtol=1e-6)
    rng = np.random.default_rng(0)
    probs = rng.uniform(size=(2, 3, 4, 9)).astype(np.float32)
    for kernel in (1, 3, 13):
        np.testing.assert_allclose(np.array(smooth_scores(mx.array(probs), kernel)),
                                   ref.smooth_scores(probs.astype(np.float64), kernel), atol=1e-7)


def test_chunk_means_average_a_short_last_chunk_over_its_own_length():
    np.testing.assert_allclose(np.array(chunk_means(mx.arange(10, dtype=mx.float32), 4)), [1.5, 5.5, 8.5])


def test_unknown_reduction_and_empty_prompt_are_config_errors():
    with pytest.raises(ConfigError, match="reduction"):
        reduce_scores(mx.ones((1, 1, 1, 3)), "median", "max")
    with pytest.raises(ConfigError, match="at least one token"):
        select_tokens(mx.zeros((0,)), SpecPrefillConfig())
