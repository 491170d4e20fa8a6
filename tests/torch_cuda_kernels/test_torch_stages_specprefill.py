"""Torch speculative-prefill scoring (twins, CPU) against the NumPy reference; selection runs on
the host for every backend (core/reference/specprefill.py)."""

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import method_ops
from specfill.backends.torch_cuda.conformance import make_adapter
from specfill.core import ConfigError, SpecPrefillConfig
from specfill.core.reference import REFERENCE
from specfill.core.reference import specprefill as reference

from .torch_stages_support import importance, randn, torch_ops

torch.set_num_threads(1)

CONFIGS = [
    SpecPrefillConfig(keep_ratio=0.1),
    SpecPrefillConfig(keep_ratio=0.3, layers="last-2", layer_reduction="mean"),
    SpecPrefillConfig(keep_ratio=0.25, head_reduction="mean", pool_kernel=5, select_chunk=7),
    SpecPrefillConfig(keep_tokens=40, select_chunk=16, pool_kernel=1),
]


def _capture(n_layers=4, n_queries=5, hq=6, hkv=2, prompt=150, dtype=torch.float64, seed=0):
    return (
        randn(n_layers, n_queries, hq, 16, dtype=dtype, seed=seed),
        randn(n_layers, hkv, prompt, 16, dtype=dtype, seed=seed + 1),
    )


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.layers},{c.head_reduction},{c.pool_kernel}")
def test_scores_and_selection_equal_reference_float64(config):
    queries, keys = _capture()
    got = reference.score_tokens(queries.numpy(), keys.numpy(), config, 0.25, make_adapter("float64", False, "cpu"))
    want = reference.score_tokens(queries.numpy(), keys.numpy(), config, 0.25, REFERENCE)
    for name in ("probs", "smoothed", "importance"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-10, atol=1e-12)
    streamed = importance(queries, keys, config, 0.25)
    np.testing.assert_allclose(streamed.numpy(), want.importance, rtol=1e-10, atol=1e-12)
    selection = reference.select_tokens(streamed.numpy(), config)
    expected = REFERENCE.select_tokens(want.importance, config)
    assert selection.kept.tolist() == expected.kept.tolist() == selection.position_ids.tolist()
    assert selection.decode_start == 150


def test_layer_streamed_importance_equals_full_scores_in_float32():
    queries, keys = _capture(dtype=torch.float32, seed=3)
    config = SpecPrefillConfig(keep_ratio=0.2)
    full = reference.score_tokens(queries.numpy(), keys.numpy(), config, 0.25, make_adapter("float32", False, "cpu"))
    streamed = importance(queries, keys, config, 0.25)
    assert streamed.dtype == torch.float32
    np.testing.assert_allclose(streamed.numpy(), full.importance, rtol=1e-6, atol=1e-9)


def test_smoothing_is_zero_padded_average_pooling():
    probs = torch.tensor([[0.0, 3.0, 0.0, 0.0, 6.0]])
    got = method_ops.smooth_scores(probs, 3)
    torch.testing.assert_close(got, torch.tensor([[1.0, 1.0, 1.0, 2.0, 2.0]]))
    torch.testing.assert_close(method_ops.smooth_scores(torch.ones(1, 2), 13), torch.full((1, 2), 2 / 13))


def test_half_precision_inputs_score_in_float32():
    queries, keys = _capture(dtype=torch.float16, prompt=40)
    probs = torch_ops().attention_scores(queries, keys, 0.25)
    assert probs.dtype == importance(queries, keys, SpecPrefillConfig(), 0.25).dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, 4, 6))


def test_bad_input_raises_clear_errors():
    with pytest.raises(ConfigError, match="reduction"):
        method_ops.reduce_axis(torch.zeros(1, 1, 1, 3), "median", 2)
    queries, keys = _capture()
    with pytest.raises(ValueError, match="multiple of"):
        torch_ops().attention_scores(queries, keys[:, :1].expand(-1, 4, -1, -1), 0.25)


@pytest.mark.parametrize("tile", [1, 37, 1 << 18], ids=["row", "few-rows", "default"])
@pytest.mark.parametrize("window,query_start", [(None, None), (None, 120), (7, None), (7, 120), (3, 100)], ids=str)
def test_cpu_tiles_equal_reference(monkeypatch, tile, window, query_start):
    """The CPU scoring and pooling run tile by tile (kernels/scoring._scores_by_tiles,
    pool_rows): any tile size (one row, a few, the default's whole prompt) gives the
    reference's numbers under every mask: causal observation windows, sliding windows, both."""
    from specfill.backends.torch_cuda.kernels import scoring

    monkeypatch.setattr(scoring, "TILE_ELEMENTS", tile)
    queries, keys = _capture(n_queries=9, prompt=150)
    got = torch_ops().attention_scores(queries, keys, 0.25, window=window, query_start=query_start)
    want = reference.attention_scores(queries.numpy(), keys.numpy(), 0.25, window=window, query_start=query_start)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
    for kernel in (1, 5, 13):
        np.testing.assert_allclose(
            method_ops.smooth_scores(got, kernel).numpy(), reference.smooth_scores(want, kernel), rtol=1e-12, atol=1e-15
        )


def test_cpu_tiles_score_blind_rows_zero(monkeypatch):
    """A query whose window holds no prompt key (look-ahead queries past the window) scores zeros."""
    from specfill.backends.torch_cuda.kernels import scoring

    monkeypatch.setattr(scoring, "TILE_ELEMENTS", 40)
    queries, keys = _capture(n_queries=6, prompt=20)
    got = torch_ops().attention_scores(queries, keys, 0.25, window=2)
    want = reference.attention_scores(queries.numpy(), keys.numpy(), 0.25, window=2)
    assert not want[2:].any() and want[:2].any()  # queries at 21.. see nothing within 2 of them
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)


def test_cpu_tiles_equal_the_whole_tensor_ops_exactly():
    """On a CPU the tiles and the whole-tensor ops (the GPU twin's path) give the same probabilities."""
    from specfill.backends.torch_cuda.kernels.scoring import attention_scores_twin

    queries, keys = _capture(n_queries=9, prompt=150, dtype=torch.float32, seed=5)
    for window, start in ((None, None), (None, 120), (7, 120)):
        tiled = attention_scores_twin(queries, keys, 0.25, window, query_start=start, tiles=True)
        whole = attention_scores_twin(queries, keys, 0.25, window, query_start=start, tiles=False)
        torch.testing.assert_close(tiled, whole, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("tile", [1, 37, 1 << 18], ids=["row", "few-rows", "default"])
@pytest.mark.parametrize("window,query_start", [(None, None), (None, 120), (7, 120), (2, None)], ids=str)
@pytest.mark.parametrize("how", ["max", "mean"])
def test_fused_layer_scores_equal_the_three_stages_exactly(monkeypatch, tile, window, query_start, how):
    """On a CPU the ops' layer_scores (kernels/scoring.pooled_head_scores: probabilities, pooling and
    the head reduction tile by tile) gives what attention_scores, smooth_scores and reduce_axis give
    one after the other (bit for bit with the max over heads; the mean's sum order may differ), for
    every tile size, mask (blind rows with window 2), pooling width and input dtype."""
    from specfill.backends.torch_cuda.kernels import scoring
    from specfill.core.ops import staged_layer_scores

    monkeypatch.setattr(scoring, "TILE_ELEMENTS", tile)
    ops = torch_ops()
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        queries, keys = _capture(n_layers=2, n_queries=9, prompt=150, dtype=dtype, seed=7)
        for kernel in (1, 5, 13):
            args = (queries, keys, 0.25, window, None, query_start, kernel, how)
            fused = ops.layer_scores(*args)
            composed = staged_layer_scores(ops, *args)
            assert fused.shape == composed.shape == (9, 2, 150) and fused.dtype == composed.dtype
            if how == "max":
                assert torch.equal(fused, composed), (dtype, kernel)
            else:  # the heads summed in order, Tensor.mean in its own: a few ulps of the stats dtype
                tol = 1e-13 if dtype == torch.float64 else 1e-6
                torch.testing.assert_close(fused, composed, rtol=tol, atol=tol * 1e-3)


def test_layer_scores_keeps_the_stage_path_for_terms_and_bad_settings():
    """Attention terms (soft-cap) go through the three stages; a bad pooling width or reduction
    gets the stages' one-line errors."""
    from specfill.core.ops import staged_layer_scores
    from specfill.core.stages import AttentionTerms

    ops = torch_ops()
    queries, keys = _capture(n_queries=3, prompt=40)
    terms = AttentionTerms(None, 5.0)
    torch.testing.assert_close(
        ops.layer_scores(queries, keys, 0.25, terms=terms, kernel=5),
        staged_layer_scores(ops, queries, keys, 0.25, terms=terms, kernel=5),
        rtol=0,
        atol=0,
    )
    with pytest.raises(ConfigError, match="pool kernel"):
        ops.layer_scores(queries, keys, 0.25, kernel=4)
    with pytest.raises(ConfigError, match="reduction"):
        ops.layer_scores(queries, keys, 0.25, how="median")
