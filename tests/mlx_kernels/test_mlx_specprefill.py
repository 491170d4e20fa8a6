"""Speculative-prefill scoring and selection on MLX (twins) against the NumPy reference."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx.conformance import make_adapter
from specfill.backends.mlx.method_ops import reduce_axis, smooth_scores
from specfill.backends.mlx.ops import MLXOps
from specfill.core import ConfigError, SpecPrefillConfig
from specfill.core.methods.specprefill import token_importance
from specfill.core.reference import REFERENCE
from specfill.core.reference import specprefill as ref

SCALE = 0.25


def captured(seed: int, n_layers: int, n_queries: int, n_heads: int, n_kv: int, prompt_len: int):
    rng = np.random.default_rng(seed)
    host = [
        rng.normal(size=(n_layers, n_queries, n_heads, 16)).astype(np.float32),
        rng.normal(size=(n_layers, n_kv, prompt_len, 16)).astype(np.float32),
    ]
    return [mx.array(h) for h in host], [h.astype(np.float64) for h in host]


@pytest.mark.parametrize(
    "config,prompt_len",
    [
        (SpecPrefillConfig(), 300),
        (SpecPrefillConfig(keep_ratio=0.3, select_chunk=8, pool_kernel=5, layers="last-2"), 101),
        (SpecPrefillConfig(keep_ratio=0.2, head_reduction="mean", layer_reduction="mean"), 150),
        (SpecPrefillConfig(keep_tokens=16, select_chunk=4, pool_kernel=1), 64),
        (SpecPrefillConfig(keep_ratio=0.5, pool_kernel=13), 5),  # prompt shorter than the pooling
    ],
)
def test_selection_matches_the_reference(config, prompt_len):
    (queries, keys), (qn, kn) = captured(prompt_len, 4, 3, 6, 2, prompt_len)
    scores, _ = ref.speculative_selection(qn, kn, config, SCALE, make_adapter("float32", False))
    want_scores, want = ref.speculative_selection(qn, kn, config, SCALE, REFERENCE)
    importance = token_importance(MLXOps(mx.default_device(), False), queries, keys, config, SCALE)
    got = ref.select_tokens(np.array(importance), config)
    np.testing.assert_allclose(np.array(importance), want_scores.importance, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(scores.smoothed, want_scores.smoothed, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(got.chunk_scores, want.chunk_scores, atol=1e-6, rtol=1e-5)
    assert np.array(got.kept).tolist() == want.kept.tolist()
    assert np.array(got.position_ids).tolist() == want.kept.tolist()  # original positions
    assert got.decode_start == prompt_len


def test_smoothing_pads_with_zeros_and_divides_by_the_kernel():
    probs = mx.array([[1.0, 0.0, 0.0, 0.0, 2.0]])
    np.testing.assert_allclose(np.array(smooth_scores(probs, 3)), [[1 / 3, 1 / 3, 0, 2 / 3, 2 / 3]], rtol=1e-6)
    rng = np.random.default_rng(0)
    probs = rng.uniform(size=(2, 3, 4, 9)).astype(np.float32)
    for kernel in (1, 3, 13):
        np.testing.assert_allclose(
            np.array(smooth_scores(mx.array(probs), kernel)),
            ref.smooth_scores(probs.astype(np.float64), kernel),
            atol=1e-7,
        )


def test_unknown_reduction_is_a_config_error():
    with pytest.raises(ConfigError, match="reduction"):
        reduce_axis(mx.ones((1, 1, 1, 3)), "median", 2)
