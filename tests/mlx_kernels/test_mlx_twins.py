"""The MLX-ops twins (what runs where Metal is absent) against the NumPy reference."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx.kernels import (
    attention_scores,
    empty_state,
    inter_attention,
    intra_attention,
    merge_states,
    reduce_colsum_to_kv_heads,
)
from specfill.core.reference import REFERENCE

DTYPES = {"float32": (mx.float32, 2e-5), "float16": (mx.float16, 3e-3)}


def inputs(rng, dtype, *shapes):
    """Random arrays rounded to dtype: (mx arrays, the same values as float64 NumPy)."""
    host = [rng.normal(size=s).astype(dtype) for s in shapes]
    return [mx.array(h) for h in host], [h.astype(np.float64) for h in host]


def close(got: mx.array, want: np.ndarray, tol: float) -> None:
    got = np.array(got.astype(mx.float32)).astype(np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_heads,n_kv,n_tokens,chunk",
    [(4, 2, 1, 8), (4, 2, 7, 8), (4, 2, 8, 8), (6, 2, 29, 8), (3, 3, 13, 4), (8, 1, 17, 16)],
)
def test_intra_twin_matches_reference(dtype, n_heads, n_kv, n_tokens, chunk):
    mx_dtype, tol = DTYPES[dtype]
    rng = np.random.default_rng(n_tokens)
    (q, k, v), (qn, kn, vn) = inputs(rng, dtype, (n_heads, n_tokens, 16), (n_kv, n_tokens, 16), (n_kv, n_tokens, 16))
    got = intra_attention(q, k, v, chunk, 0.25, use_kernel=False)
    want = REFERENCE.intra_attention(qn, kn, vn, chunk, 0.25)
    assert got.state.m.dtype == mx.float32 and got.state.l.dtype == mx.float32
    assert got.state.o.dtype == mx_dtype
    close(got.state.m, want.state.m, tol)
    close(got.state.l, want.state.l, tol)
    close(got.state.o, want.state.o, tol)
    close(got.colsum, want.colsum, tol)


def test_intra_colsum_counts_real_queries_only():
    """Each query's weights sum to 1, so a chunk's column sums add up to its query count:
    the padded query rows of a partial last chunk must not vote."""
    rng = np.random.default_rng(0)
    (q, k, v), _ = inputs(rng, "float32", (2, 11, 8), (2, 11, 8), (2, 11, 8))
    colsum = np.array(intra_attention(q, k, v, 4, 0.5, use_kernel=False).colsum)
    np.testing.assert_allclose(colsum[:, 0:4].sum(axis=1), 4, rtol=1e-6)
    np.testing.assert_allclose(colsum[:, 8:11].sum(axis=1), 3, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group,n_slots,logit_max", [(1, 5, None), (3, 7, None), (2, 1, None), (2, 6, 100.0)])
def test_inter_twin_matches_reference(dtype, group, n_slots, logit_max):
    mx_dtype, tol = DTYPES[dtype]
    rng = np.random.default_rng(group * 10 + n_slots)
    qn = rng.normal(size=(2 * group, 8, 16))
    kn, vn = rng.normal(size=(2, 2, n_slots, 16))
    if logit_max:
        logits = np.einsum("htd,hmd->htm", qn, np.repeat(kn, group, axis=0)) * 0.25
        qn = qn * logit_max / np.abs(logits).max()
    qn, kn, vn = (x.astype(dtype).astype(np.float64) for x in (qn, kn, vn))
    got = inter_attention(*(mx.array(x).astype(mx_dtype) for x in (qn, kn, vn)), 0.25, use_kernel=False)
    want = REFERENCE.inter_attention(qn, kn, vn, 0.25)
    close(got.state.m, want.state.m, tol)
    close(got.state.l, want.state.l, tol)
    close(got.state.o, want.state.o, tol)
    close(got.colsum, want.colsum, tol)


def test_inter_with_empty_memory_is_the_empty_state():
    q = mx.ones((4, 8, 16))
    got = inter_attention(q, mx.zeros((2, 0, 16)), mx.zeros((2, 0, 16)), 0.25, use_kernel=False)
    assert np.isneginf(np.array(got.state.m)).all()
    assert not np.array(got.state.l).any() and not np.array(got.state.o).any()
    assert got.colsum.shape == (4, 0)


def test_merge_of_two_key_blocks_is_attention_over_their_union():
    rng = np.random.default_rng(3)
    (q, k, v), _ = inputs(rng, "float32", (4, 8, 16), (2, 12, 16), (2, 12, 16))
    whole = inter_attention(q, k, v, 0.25, use_kernel=False).state
    merged = merge_states(
        inter_attention(q, k[:, :5], v[:, :5], 0.25, use_kernel=False).state,
        inter_attention(q, k[:, 5:], v[:, 5:], 0.25, use_kernel=False).state,
    )
    for got, want in ((merged.m, whole.m), (merged.l, whole.l), (merged.o, whole.o)):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=2e-6, atol=2e-6)


def test_merge_with_empty_states_has_no_nan():
    rng = np.random.default_rng(4)
    (q, k, v), _ = inputs(rng, "float32", (2, 3, 8), (2, 5, 8), (2, 5, 8))
    full = inter_attention(q, k, v, 0.3, use_kernel=False).state
    empty = empty_state(2, 3, 8, mx.float32)
    for a, b in ((empty, full), (full, empty)):
        got = merge_states(a, b)
        np.testing.assert_allclose(np.array(got.o), np.array(full.o), rtol=1e-6)
        np.testing.assert_allclose(np.array(got.l), np.array(full.l), rtol=1e-6)
    both = merge_states(empty, empty)
    assert np.isneginf(np.array(both.m)).all()
    assert np.isfinite(np.array(both.o)).all() and not np.array(both.l).any()


@pytest.mark.parametrize("group", [1, 3])
def test_reduce_colsum_sums_the_query_heads_of_each_kv_head(group):
    colsum = mx.arange(2 * group * 5, dtype=mx.float32).reshape(2 * group, 5)
    want = np.array(colsum).reshape(2, group, 5).sum(axis=1)
    np.testing.assert_array_equal(np.array(reduce_colsum_to_kv_heads(colsum, 2)), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads,n_kv,prompt_len", [(4, 2, 1), (4, 2, 37), (6, 2, 90), (2, 2, 5)])
def test_scoring_twin_matches_reference(dtype, n_heads, n_kv, prompt_len):
    mx_dtype, tol = DTYPES[dtype]
    rng = np.random.default_rng(prompt_len)
    (queries, keys), (qn, kn) = inputs(rng, dtype, (3, 4, n_heads, 16), (3, n_kv, prompt_len, 16))
    got = attention_scores(queries, keys, 0.25, use_kernel=False)
    assert got.dtype == mx.float32 and got.shape == (4, 3, n_heads, prompt_len)
    close(got, REFERENCE.attention_scores(qn, kn, 0.25), tol)


def test_inputs_of_mixed_dtypes_are_refused_on_every_path():
    q = mx.ones((2, 4, 8), dtype=mx.float16)
    with pytest.raises(ValueError, match="share one dtype"):
        intra_attention(q, q.astype(mx.float32), q, 4, 1.0, use_kernel=False)
