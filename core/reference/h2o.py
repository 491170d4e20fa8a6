"""NumPy reference of H2O two-phase chunked sparse prefill (seed 001), one layer.

For query i in chunk C_c the keys are K(i) = {j in C_c : j <= i} U M_{c-1}.
These are the stages (phase 1 of every chunk at once, phase 2's attention to a memory set, score
accumulation, memory-set choice); the chunk walk that strings them together is written once for
every backend in core/h2o_walk.py.
"""

from __future__ import annotations

import math

import numpy as np

from ..stages import (
    AttentionState,
    AttentionTerms,
    InterResult,
    IntraResult,
    KeyWindow,
    MemorySet,
    sinks_of,
    softcap_of,
)
from .attention import accumulation_dtype, add_sinks, empty_state, expand_kv_heads, masked_state, soft_cap


def _head_sinks(terms: AttentionTerms | None, dtype: type, extra_axes: int) -> np.ndarray | None:
    """The terms' sinks [Hq] as [Hq, 1, ...] (extra_axes ones) in `dtype`, or None."""
    sinks = sinks_of(terms)
    return None if sinks is None else np.asarray(sinks, dtype=dtype).reshape(-1, *([1] * extra_axes))


def intra_attention(q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True) -> IntraResult:
    """The stage H2OStageOps.intra_attention (core/stages.py) on NumPy arrays: every chunk at once,
    padded to S and attended as one [S, S] block, in the accumulation dtype; the state stays
    sink-free, the sinks join the column sums' softmax denominators (core/reference/attention.py)."""
    n_heads, n_tokens = q.shape[:2]
    dtype = accumulation_dtype(q, k, v)
    n_chunks = math.ceil(n_tokens / chunk_size)
    padded = n_chunks * chunk_size

    def blocks(x: np.ndarray) -> np.ndarray:  # keys' and values' own head dims (latent attention's differ)
        x = expand_kv_heads(x, n_heads).astype(dtype, copy=False)
        x = np.pad(x, ((0, 0), (0, padded - n_tokens), (0, 0)))
        return x.reshape(n_heads, n_chunks, chunk_size, x.shape[-1])

    qb, kb, vb = blocks(q), blocks(k), blocks(v)
    logits = soft_cap(np.einsum("hcid,hcjd->hcij", qb, kb) * dtype(scale), softcap_of(terms))
    local = np.arange(chunk_size)
    real = (np.arange(n_chunks)[:, None] * chunk_size + local[None, :]) < n_tokens  # [C, S]
    distance = local[:, None] - local[None, :]  # [S(query), S(key)]
    causal = (distance >= 0) & (distance < (np.inf if window is None else window))
    valid = causal[None, :, :] & real[:, None, :]
    state, weights = masked_state(logits, valid[None], vb, _head_sinks(terms, dtype, 2))
    flat = lambda x: x.reshape(n_heads, padded, *x.shape[3:])[:, :n_tokens]  # noqa: E731
    state = AttentionState(flat(state.m), flat(state.l), flat(state.o))
    if not with_colsum:
        return IntraResult(state, None)
    # column sums count real queries only (padded query rows would see real keys)
    return IntraResult(state, flat((weights * real[None, :, :, None]).sum(axis=2)))


def causal_attention(q, k, v, scale, window=None, terms=None) -> AttentionState:
    """Plain causal attention (intra_attention's arguments but chunk_size): the intra stage with one
    chunk spanning the whole prompt (its state over every key of each query, so a sink is folded
    in here)."""
    state = intra_attention(q, k, v, max(1, q.shape[1]), scale, window, terms).state
    return state if sinks_of(terms) is None else add_sinks(state, sinks_of(terms))


def key_window_mask(window: KeyWindow, n_queries: int, n_kv: int, n_keys: int) -> np.ndarray:
    """[Hkv, T, M] bool: which key slot each query row sees under `window`."""
    positions = (
        np.arange(window.key_start, window.key_start + n_keys)[None]
        if window.key_positions is None
        else np.asarray(window.key_positions, dtype=np.int64)
    )
    distance = (window.query_start + np.arange(n_queries))[None, :, None] - positions[:, None, :]
    return np.broadcast_to((distance >= 0) & (distance < window.size), (n_kv, n_queries, n_keys))


def inter_attention(q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True) -> InterResult:
    """The stage H2OStageOps.inter_attention (core/stages.py) on NumPy arrays, in the accumulation
    dtype; an empty memory (M = 0) gives the empty state and no column sums."""
    n_heads, n_tokens = q.shape[:2]
    dtype = accumulation_dtype(q, k_mem, v_mem)
    if k_mem.shape[1] == 0:  # the empty state's output has the values' head dim
        colsum = np.zeros((n_heads, 0), dtype) if with_colsum else None
        return InterResult(empty_state(n_heads, n_tokens, v_mem.shape[-1], dtype), colsum)
    kr = expand_kv_heads(k_mem, n_heads).astype(dtype, copy=False)
    vr = expand_kv_heads(v_mem, n_heads).astype(dtype, copy=False)
    logits = soft_cap(np.einsum("htd,hmd->htm", q.astype(dtype, copy=False), kr) * dtype(scale), softcap_of(terms))
    valid = (
        np.bool_(True)
        if window is None
        else expand_kv_heads(key_window_mask(window, n_tokens, k_mem.shape[0], k_mem.shape[1]), n_heads)
    )
    state, weights = masked_state(logits, valid, vr, _head_sinks(terms, dtype, 1))
    return InterResult(state, weights.sum(axis=1) if with_colsum else None)


def reduce_colsum_to_kv_heads(colsum: np.ndarray, n_kv_heads: int) -> np.ndarray:
    """Sum the column sums of the G query heads that share each KV head."""
    n_heads = colsum.shape[0]
    return colsum.reshape(n_kv_heads, n_heads // n_kv_heads, *colsum.shape[1:]).sum(axis=1)


def accumulate_scores(scores: np.ndarray, memory: MemorySet, kv_colsum: np.ndarray) -> np.ndarray:
    """score(j) += sum_i A_inter(i, j) for every memory position j, per KV head."""
    out = scores.copy()
    rows = np.arange(scores.shape[0])[:, None]
    np.add.at(out, (rows, memory.indices), kv_colsum.astype(out.dtype, copy=False))
    return out


def local_window(chunk_start: int, chunk_end: int, local: int) -> np.ndarray:
    """The tail `local` positions of the chunk [chunk_start, chunk_end)."""
    return np.arange(max(chunk_start, chunk_end - local), chunk_end, dtype=np.int64)


def build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy) -> MemorySet:
    """The stage H2OStageOps.build_memory_set: M_c = Local_c U top-H((M_{c-1} U C_c) minus Local_c),
    per KV head, sorted; one row at a time, ranked by (-score, position)."""
    local_idx = local_window(chunk_start, chunk_end, local)
    chunk_rest = np.arange(chunk_start, local_idx[0] if local_idx.size else chunk_end, dtype=np.int64)
    rows = []
    for g in range(scores.shape[0]):
        prev = previous.indices[g] if previous is not None else np.empty(0, np.int64)
        candidates = np.concatenate([prev, chunk_rest])  # disjoint: M_{c-1} lies before C_c
        order = np.lexsort((candidates, -scores[g, candidates]))  # score desc, then position asc
        rows.append(np.sort(np.concatenate([local_idx, candidates[order[:heavy]]])))
    return MemorySet(np.stack(rows).astype(np.int64), chunk_index)


def gather_memory(k: np.ndarray, v: np.ndarray, memory: MemorySet) -> tuple[np.ndarray, np.ndarray]:
    """Per-KV-head gather of the memory rows: [Hkv, n, D] -> [Hkv, M, D]."""
    idx = memory.indices[:, :, None]
    return np.take_along_axis(k, idx, axis=1), np.take_along_axis(v, idx, axis=1)
