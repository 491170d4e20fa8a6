"""Every Metal kernel against its MLX-ops twin, at float32 and float16.

`metal_path` runs each test twice: on real Metal (skipped where MLX has no Metal back-end, so a
Mac user runs them with the same command) and through the C++ emulator of the kernel sources
(tests/mlx_kernels/metal_emulator.py), which runs here and catches indexing and maths errors.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_test_support import HAS_METAL, NO_METAL_REASON, needs_gxx

from specfill.backends.mlx.kernels import (
    attention_scores,
    dispatch,
    inter,
    inter_attention,
    intra,
    intra_attention,
    scoring,
)
from specfill.backends.mlx.ops import MLXOps
from specfill.conformance import run_conformance
from specfill.core import BackendUnavailableError, H2OConfig, SpecPrefillConfig
from specfill.core import h2o_walk as h2o
from specfill.core.methods.specprefill import token_importance
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import select_tokens
from specfill.core.reference.specprefill import speculative_selection as reference_selection

# o tolerance: fp16 outputs may differ by one rounding of the stored value
DTYPES = {"float32": (mx.float32, 1e-4), "float16": (mx.float16, 2e-3)}
# float32 statistics: another summation order and Metal's exp() (a few ulp) on logits up to ~100
STATS_TOL = 1e-4


def h2o_attention_layer(q, k, v, config, scale, use_kernels):
    """The core's one walk over the MLX ops, kernels forced or off."""
    return h2o.h2o_attention_layer(MLXOps(mx.default_device(), use_kernels), q, k, v, config, scale)


def arrays(seed: int, dtype: mx.Dtype, *shapes: tuple[int, ...], scale: float = 1.0) -> list[mx.array]:
    rng = np.random.default_rng(seed)
    return [mx.array(rng.normal(size=s) * scale).astype(dtype) for s in shapes]


def same(got: mx.array, want: mx.array, tol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    got32, want32 = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
    assert np.isfinite(got32).all()
    np.testing.assert_allclose(got32, want32, atol=tol, rtol=tol)


def same_result(kernel, twin, tol: float) -> None:
    same(kernel.state.m, twin.state.m, STATS_TOL)
    same(kernel.state.l, twin.state.l, STATS_TOL)
    same(kernel.state.o, twin.state.o, tol)
    same(kernel.colsum, twin.colsum, STATS_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_heads,n_kv,n_tokens,chunk,head_dim", [(4, 2, 1, 8, 16), (4, 2, 21, 8, 16), (6, 2, 16, 8, 32), (2, 2, 9, 16, 8)]
)
def test_intra_kernel_matches_twin(metal_path, dtype, n_heads, n_kv, n_tokens, chunk, head_dim):
    mx_dtype, tol = DTYPES[dtype]
    q, k, v = arrays(
        n_tokens, mx_dtype, (n_heads, n_tokens, head_dim), (n_kv, n_tokens, head_dim), (n_kv, n_tokens, head_dim)
    )
    same_result(
        intra_attention(q, k, v, chunk, head_dim**-0.5, use_kernel=True),
        intra_attention(q, k, v, chunk, head_dim**-0.5, use_kernel=False),
        tol,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_heads,n_kv,n_tokens,n_slots,scale",
    [(4, 2, 8, 5, 0.25), (6, 2, 3, 1, 0.25), (4, 4, 8, 7, 0.25), (4, 2, 8, 6, 8.0)],
)
def test_inter_kernel_matches_twin(metal_path, dtype, n_heads, n_kv, n_tokens, n_slots, scale):
    mx_dtype, tol = DTYPES[dtype]
    q, k_mem, v_mem = arrays(n_slots, mx_dtype, (n_heads, n_tokens, 16), (n_kv, n_slots, 16), (n_kv, n_slots, 16))
    same_result(
        inter_attention(q, k_mem, v_mem, scale, use_kernel=True),
        inter_attention(q, k_mem, v_mem, scale, use_kernel=False),
        tol,
    )


def test_inter_kernel_path_with_empty_memory_is_the_empty_state(metal_path):
    got = inter_attention(mx.ones((4, 8, 16)), mx.zeros((2, 0, 16)), mx.zeros((2, 0, 16)), 0.25, use_kernel=True)
    assert np.isneginf(np.array(got.state.m)).all() and not np.array(got.state.l).any()
    assert np.isfinite(np.array(got.state.o)).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_layers,n_queries,n_heads,n_kv,prompt_len", [(3, 4, 4, 2, 37), (1, 1, 2, 2, 1), (2, 3, 6, 2, 70)]
)
def test_scoring_kernel_matches_twin(metal_path, dtype, n_layers, n_queries, n_heads, n_kv, prompt_len):
    mx_dtype, _ = DTYPES[dtype]
    queries, keys = arrays(prompt_len, mx_dtype, (n_layers, n_queries, n_heads, 16), (n_layers, n_kv, prompt_len, 16))
    same(
        attention_scores(queries, keys, 0.25, use_kernel=True),
        attention_scores(queries, keys, 0.25, use_kernel=False),
        STATS_TOL,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_h2o_layer_on_the_kernels_matches_the_twins(metal_path, dtype):
    mx_dtype, tol = DTYPES[dtype]
    q, k, v = arrays(5, mx_dtype, (4, 45, 16), (2, 45, 16), (2, 45, 16))
    config = H2OConfig(chunk_size=8, batch_size=16, local=2, heavy=3, dense_tail=0)
    kernel = h2o_attention_layer(q, k, v, config, 0.25, use_kernels=True)
    twin = h2o_attention_layer(q, k, v, config, 0.25, use_kernels=False)
    # random scores have no near-ties at this size: the memory sets must agree exactly
    agree = [
        np.array_equal(np.array(a.indices), np.array(b.indices)) for a, b in zip(kernel.memory_sets, twin.memory_sets)
    ]
    assert len(kernel.memory_sets) == len(twin.memory_sets) == 5 and all(agree)
    same(kernel.output, twin.output, tol)
    same(kernel.scores, twin.scores, STATS_TOL)


def test_speculative_selection_on_the_kernel_matches_the_reference(metal_path):
    queries, keys = arrays(9, mx.float32, (3, 4, 4, 16), (3, 2, 120, 16))
    config = SpecPrefillConfig(keep_ratio=0.25, select_chunk=8, pool_kernel=5)
    importance = token_importance(MLXOps(mx.default_device(), True), queries, keys, config, 0.25)
    got = select_tokens(np.array(importance), config)
    _, want = reference_selection(np.array(queries), np.array(keys), config, 0.25, REFERENCE)
    assert np.array(got.kept).tolist() == want.kept.tolist()


def test_conformance_passes_on_the_emulated_kernels(emulated_metal):
    """The whole conformance suite with every Metal kernel forced, run by the emulator."""
    report = run_conformance("mlx", ["float32", "float16"], use_kernels=True)
    assert report.passed, [f"{r.check} [{r.case}] {r.detail}" for r in report.failures[:5]]


@pytest.mark.skipif(HAS_METAL, reason="checks the error raised where Metal is absent")
@pytest.mark.parametrize("stage", ["intra", "inter", "scoring", "layer"])
def test_forcing_kernels_without_metal_raises_a_clear_error(stage):
    q = mx.ones((2, 8, 8))
    calls = {
        "intra": lambda: intra_attention(q, q, q, 4, 1.0, use_kernel=True),
        "inter": lambda: inter_attention(q, q, q, 1.0, use_kernel=True),
        "scoring": lambda: attention_scores(q[None], q[None], 1.0, use_kernel=True),
        "layer": lambda: h2o_attention_layer(q, q, q, H2OConfig(4, 8, 1, 1, dense_tail=0), 1.0, use_kernels=True),
    }
    with pytest.raises(BackendUnavailableError, match="Metal"):
        calls[stage]()


@pytest.mark.skipif(HAS_METAL, reason=NO_METAL_REASON.replace("needs", "checks the choice made without"))
def test_the_dispatchers_choose_the_twins_without_metal(monkeypatch):
    def no_builder():
        raise AssertionError("a Metal kernel was built although Metal is absent")

    for module, builder in (
        (intra, "_make_intra_kernel"),
        (inter, "_make_inter_kernel"),
        (scoring, "_make_scoring_kernel"),
    ):
        monkeypatch.setattr(module, builder, no_builder)
    assert not dispatch.metal_available()
    q = mx.ones((2, 8, 8))
    intra_attention(q, q, q, 4, 1.0)
    inter_attention(q, q, q, 1.0)
    attention_scores(q[None], q[None], 1.0)


@needs_gxx
@pytest.mark.parametrize("planted", ["reads one key past the query", "wrong GQA head"])
def test_the_emulator_catches_planted_kernel_bugs(monkeypatch, planted):
    """The emulated runs above are not vacuous: a broken kernel source fails them."""
    from metal_emulator import EmulatedKernel

    old, new = {
        "reads one key past the query": ("j <= i;", "j <= i + 1;"),
        "wrong GQA head": ("const int g = h / G;", "const int g = h % G;"),
    }[planted]
    broken = dict(intra.INTRA_ATTENTION_SPEC, source=intra.INTRA_ATTENTION_SOURCE.replace(old, new))
    assert broken["source"] != intra.INTRA_ATTENTION_SOURCE
    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    monkeypatch.setattr(
        intra, "_make_intra_kernel", lambda: (EmulatedKernel(**broken), EmulatedKernel(**intra.INTRA_COLSUM_SPEC))
    )
    q, k, v = arrays(0, mx.float32, (4, 16, 16), (2, 16, 16), (2, 16, 16))
    with pytest.raises((IndexError, AssertionError)):
        same_result(
            intra_attention(q, k, v, 8, 0.25, use_kernel=True),
            intra_attention(q, k, v, 8, 0.25, use_kernel=False),
            1e-4,
        )
