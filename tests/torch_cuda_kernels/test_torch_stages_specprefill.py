"""Torch speculative-prefill scoring and selection (twins, CPU) against the NumPy reference."""
import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import specprefill
from specfill.core import ConfigError, SpecPrefillConfig
from specfill.core.reference import REFERENCE
from specfill.core.reference import specprefill as reference

from .torch_stages_support import randn

torch.set_num_threads(1)

CONFIGS = [
    SpecPrefillConfig(keep_ratio=0.1),
    SpecPrefillConfig(keep_ratio=0.3, layers="last-2", layer_reduction="mean"),
    SpecPrefillConfig(keep_ratio=0.25, head_reduction="mean", pool_kernel=5, select_chunk=7),
    SpecPrefillConfig(keep_tokens=40, select_chunk=16, pool_kernel=1),
]


def _capture(n_layers=4, n_queries=5, hq=6, hkv=2, prompt=150, dtype=torch.float64, seed=0):
    return (randn(n_layers, n_queries, hq, 16, dtype=dtype, seed=seed),
            randn(n_layers, hkv, prompt, 16, dtype=dtype, seed=seed + 1))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.layers},{c.head_reduction},{c.pool_kernel}")
def test_scores_and_selection_equal_reference_float64(config):
    queries, keys = _capture()
    got = specprefill.score_tokens(queries, keys, config, 0.25, use_kernels=False)
    want = reference.score_tokens(queries.numpy(), keys.numpy(), config, 0.25, REFERENCE)
    for name in ("probs", "smoothed", "importance"):
        np.testing.assert_allclose(getattr(got, name).numpy(), getattr(want, name), rtol=1e-10, atol=1e-12)
    importance, selection = specprefill.speculative_selection(queries, keys, config, 0.25, use_kernels=False)
    np.testing.assert_allclose(importance.numpy(), want.importance, rtol=1e-10, atol=1e-12)
    expected = REFERENCE.select_tokens(want.importance, config)
    assert selection.kept.tolist() == expected.kept.tolist()
    assert selection.position_ids.tolist() == expected.kept.tolist()
    assert selection.decode_start == 150
    np.testing.assert_allclose(selection.chunk_scores.numpy(), expected.chunk_scores, rtol=1e-12)


def test_layer_streamed_importance_equals_full_scores_in_float32():
    queries, keys = _capture(dtype=torch.float32, seed=3)
    config = SpecPrefillConfig(keep_ratio=0.2)
    full = specprefill.score_tokens(queries, keys, config, 0.25, use_kernels=False).importance
    streamed = specprefill.token_importance(queries, keys, config, 0.25, use_kernels=False)
    assert streamed.dtype == torch.float32
    torch.testing.assert_close(streamed, full, rtol=1e-6, atol=1e-9)


def test_selection_ties_go_to_the_earlier_chunk_and_last_token_is_forced():
    importance = torch.tensor([1.0] * 8 + [3.0] * 4 + [1.0] * 8 + [0.0] * 4)  # chunks of 4
    selection = specprefill.select_tokens(importance, SpecPrefillConfig(keep_ratio=0.5, select_chunk=4))
    # 6 chunks -> 3 kept: chunk 2 (mean 3), then chunks 0 and 1 win the tie with 3 and 4
    assert selection.kept.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 23]
    assert selection.decode_start == 24


def test_keep_everything_keeps_every_position_in_order():
    importance = torch.rand(77, generator=torch.Generator().manual_seed(0))
    selection = specprefill.select_tokens(importance, SpecPrefillConfig(keep_ratio=1.0))
    assert selection.kept.tolist() == list(range(77)) == selection.position_ids.tolist()


def test_smoothing_is_zero_padded_average_pooling():
    probs = torch.tensor([[0.0, 3.0, 0.0, 0.0, 6.0]])
    got = specprefill.smooth_scores(probs, 3)
    torch.testing.assert_close(got, torch.tensor([[1.0, 1.0, 1.0, 2.0, 2.0]]))
    torch.testing.assert_close(specprefill.smooth_scores(torch.ones(1, 2), 13), torch.full((1, 2), 2 / 13))


def test_half_precision_inputs_score_in_float32():
    queries, keys = _capture(dtype=torch.float16, prompt=40)
    scores = specprefill.score_tokens(queries, keys, SpecPrefillConfig(), 0.25, use_kernels=False)
    assert scores.probs.dtype == scores.importance.dtype == torch.float32
    torch.testing.assert_close(scores.probs.sum(-1), torch.ones(5, 4, 6))


def test_bad_input_raises_clear_errors():
    with pytest.raises(ConfigError, match="at least one token"):
        specprefill.select_tokens(torch.zeros(0), SpecPrefillConfig())
    with pytest.raises(ConfigError, match="reduction"):
        specprefill.reduce_scores(torch.zeros(1, 1, 1, 3), "median", "max")
    queries, keys = _capture()
    with pytest.raises(ValueError, match="multiple of"):
        specprefill.attention_scores(queries, keys[:, :1].expand(-1, 4, -1, -1), 0.25)
