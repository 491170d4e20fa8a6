"""NumPy reference of H2O two-phase chunked sparse prefill (seed 001), one layer.

For query i in chunk C_c the keys are K(i) = {j in C_c : j <= i} U M_{c-1}.
Phase 1 computes the intra part of every chunk at once; phase 2 walks the chunks, attends to
the previous memory set, accumulates scores, merges exactly and builds the next memory set.
"""
from __future__ import annotations

import math

import numpy as np

from ..config import H2OConfig
from ..stages import AttentionState, H2OCarry, H2OLayerResult, H2OStages, InterResult, IntraResult, MemorySet
from .attention import accumulation_dtype, empty_state, expand_kv_heads, masked_state, slice_state


def intra_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk_size: int,
                    scale: float) -> IntraResult:
    """Block-diagonal causal attention of all chunks at once (chunks start at token 0)."""
    n_heads, n_tokens, head_dim = q.shape
    dtype = accumulation_dtype(q, k, v)
    n_chunks = math.ceil(n_tokens / chunk_size)
    padded = n_chunks * chunk_size

    def blocks(x: np.ndarray) -> np.ndarray:
        x = expand_kv_heads(x, n_heads).astype(dtype, copy=False)
        x = np.pad(x, ((0, 0), (0, padded - n_tokens), (0, 0)))
        return x.reshape(n_heads, n_chunks, chunk_size, head_dim)

    qb, kb, vb = blocks(q), blocks(k), blocks(v)
    logits = np.einsum("hcid,hcjd->hcij", qb, kb) * dtype(scale)
    local = np.arange(chunk_size)
    real = (np.arange(n_chunks)[:, None] * chunk_size + local[None, :]) < n_tokens  # [C, S]
    causal = local[None, :] <= local[:, None]  # [S(query), S(key)]
    valid = causal[None, :, :] & real[:, None, :]
    state, weights = masked_state(logits, valid[None], vb)
    # column sums count real queries only (padded query rows would see real keys)
    colsum = (weights * real[None, :, :, None]).sum(axis=2)
    flat = lambda x: x.reshape(n_heads, padded, *x.shape[3:])[:, :n_tokens]  # noqa: E731
    return IntraResult(AttentionState(flat(state.m), flat(state.l), flat(state.o)), flat(colsum))


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> AttentionState:
    """Plain causal attention: the intra stage with one chunk spanning the whole prompt."""
    return intra_attention(q, k, v, max(1, q.shape[1]), scale).state


def inter_attention(q: np.ndarray, k_mem: np.ndarray, v_mem: np.ndarray, scale: float) -> InterResult:
    """Attention of a chunk's queries to its gathered memory keys, no mask."""
    n_heads, n_tokens, head_dim = q.shape
    dtype = accumulation_dtype(q, k_mem, v_mem)
    if k_mem.shape[1] == 0:
        return InterResult(empty_state(n_heads, n_tokens, head_dim, dtype), np.zeros((n_heads, 0), dtype))
    kr = expand_kv_heads(k_mem, n_heads).astype(dtype, copy=False)
    vr = expand_kv_heads(v_mem, n_heads).astype(dtype, copy=False)
    logits = np.einsum("htd,hmd->htm", q.astype(dtype, copy=False), kr) * dtype(scale)
    state, weights = masked_state(logits, np.bool_(True), vr)
    return InterResult(state, weights.sum(axis=1))


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


def build_memory_set(scores: np.ndarray, previous: MemorySet | None, chunk_index: int,
                     chunk_start: int, chunk_end: int, local: int, heavy: int) -> MemorySet:
    """M_c = Local_c U top-H((M_{c-1} U C_c) minus Local_c), per KV head, sorted."""
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


def h2o_attention_batch(q: np.ndarray, k: np.ndarray, v: np.ndarray, carry: H2OCarry,
                        config: H2OConfig, scale: float, is_last: bool,
                        stages: H2OStages) -> tuple[np.ndarray, H2OCarry]:
    """One logical batch of one layer: phase 1 for all its chunks, then the phase-2 walk.

    q [Hq, T, D] are the batch's queries, positions [carry.n_done, carry.n_done + T);
    k/v [Hkv, >= carry.n_done + T, D] hold every key so far (memory sets point back into them).
    """
    size = config.chunk_size
    start, n_tokens = carry.n_done, q.shape[1]
    n_kv = k.shape[0]
    if start % size != 0:
        raise ValueError(f"a logical batch must start on a chunk boundary, got {start}")
    intra = stages.intra_attention(q, k[:, start:start + n_tokens], v[:, start:start + n_tokens],
                                   size, scale)
    # scores of every chunk in the batch are initialised from the phase-1 column sums
    scores = np.concatenate([carry.scores, stages.reduce_colsum_to_kv_heads(intra.colsum, n_kv)], axis=1)
    memory, memory_sets = carry.memory, list(carry.memory_sets)
    out = np.empty(intra.state.o.shape, dtype=intra.state.o.dtype)
    for local_start in range(0, n_tokens, size):
        local_end = min(local_start + size, n_tokens)
        chunk_start, chunk_end = start + local_start, start + local_end
        state = slice_state(intra.state, local_start, local_end)
        if memory is not None:
            k_mem, v_mem = stages.gather_memory(k, v, memory)
            inter = stages.inter_attention(q[:, local_start:local_end], k_mem, v_mem, scale)
            scores = stages.accumulate_scores(
                scores, memory, stages.reduce_colsum_to_kv_heads(inter.colsum, n_kv))
            state = stages.merge_states(inter.state, state)
        out[:, local_start:local_end] = state.o
        if is_last and local_end == n_tokens:
            break  # no memory set after the final chunk: nothing would read it
        if local_end - local_start != size:
            raise ValueError("only the final chunk of a prompt may be partial")
        memory = stages.build_memory_set(scores, memory, chunk_start // size, chunk_start, chunk_end,
                                         config.local, config.heavy)
        memory_sets.append(memory)
    return out, H2OCarry(scores=scores, memory=memory, memory_sets=memory_sets)


def h2o_attention_layer(q: np.ndarray, k: np.ndarray, v: np.ndarray, config: H2OConfig,
                        scale: float, stages: H2OStages) -> H2OLayerResult:
    """Whole-prompt H2O attention for one layer, logical batch by logical batch.

    With H2O disabled (L + H = 0) this is plain causal attention, as in the llama.cpp plan.
    """
    n_tokens, n_kv = q.shape[1], k.shape[0]
    if not config.enabled:
        state = stages.intra_attention(q, k, v, max(1, n_tokens), scale).state
        return H2OLayerResult(state.o, np.zeros((n_kv, n_tokens), state.o.dtype), [])
    dtype = accumulation_dtype(q, k, v)
    carry = H2OCarry(scores=np.zeros((n_kv, 0), dtype))
    outputs = []
    for batch_start in range(0, n_tokens, config.batch_size):
        batch_end = min(batch_start + config.batch_size, n_tokens)
        out, carry = h2o_attention_batch(q[:, batch_start:batch_end], k, v, carry, config, scale,
                                         is_last=batch_end == n_tokens, stages=stages)
        outputs.append(out)
    return H2OLayerResult(np.concatenate(outputs, axis=1), carry.scores, carry.memory_sets)


def h2o_dot_products(n_tokens: int, chunk_size: int, memory_size: int) -> int:
    """q.k products per head of H2O prefill: causal intra per chunk + one memory per later chunk."""
    total = 0
    for chunk_start in range(0, n_tokens, chunk_size):
        length = min(chunk_size, n_tokens - chunk_start)
        total += length * (length + 1) // 2
        if chunk_start > 0:
            total += length * memory_size
    return total


def full_dot_products(n_tokens: int) -> int:
    """q.k products per head of full causal prefill."""
    return n_tokens * (n_tokens + 1) // 2
