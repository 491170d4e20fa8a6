"""H2O two-phase chunked sparse prefill (seed 001) on MLX, one layer at a time.

For query i in chunk C_c the keys are K(i) = {j in C_c : j <= i} U M_{c-1}. Phase 1 runs the
intra attention of every chunk of a logical batch at once; phase 2 walks the chunks: attend to
the previous memory set, accumulate scores, merge exactly, build the next memory set. The MLX
model calls `h2o_attention_batch` per layer and logical batch with the layer's post-RoPE q, k, v
and keeps one `H2OCarry` per layer; `h2o_attention_layer` does a whole prompt in one call.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from specfill.core.config import H2OConfig

from .kernels import (AttentionState, inter_attention, intra_attention, merge_states,
                      reduce_colsum_to_kv_heads, slice_state)
from .ranking import descending_order


@dataclass(frozen=True)
class MemorySet:
    """M_c per KV head: indices [Hkv, M] int32 prompt positions, ascending and unique per row."""

    indices: mx.array
    chunk_index: int

    @property
    def size(self) -> int:
        return int(self.indices.shape[1])


@dataclass
class H2OCarry:
    """What one layer carries from a logical batch to the next.

    scores: [Hkv, n_done] float32 accumulated score of every processed position.
    memory: the memory set the next chunk attends to (None before chunk 0 is done).
    memory_sets: every memory set built so far, in chunk order.
    """

    scores: mx.array
    memory: MemorySet | None = None
    memory_sets: list[MemorySet] = field(default_factory=list)

    @classmethod
    def start(cls, n_kv_heads: int) -> H2OCarry:
        return cls(scores=mx.zeros((n_kv_heads, 0), dtype=mx.float32))

    @property
    def n_done(self) -> int:
        return int(self.scores.shape[1])


@dataclass(frozen=True)
class H2OLayerResult:
    """output [Hq, N, D] (q's dtype), scores [Hkv, N] float32, memory sets M_0 .. M_{k-2}."""

    output: mx.array
    scores: mx.array
    memory_sets: list[MemorySet]


def accumulate_scores(scores: mx.array, memory: MemorySet, kv_colsum: mx.array) -> mx.array:
    """scores[g, memory[g, s]] += kv_colsum[g, s]: the inter attention votes for its keys."""
    rows = mx.arange(scores.shape[0])[:, None]
    return scores.at[rows, memory.indices].add(kv_colsum.astype(scores.dtype))


def build_memory_set(scores: mx.array, previous: MemorySet | None, chunk_index: int,
                     chunk_start: int, chunk_end: int, local: int, heavy: int) -> MemorySet:
    """M_c = tail-L of C_c U top-H((M_{c-1} U C_c) minus the tail), per KV head, sorted.

    Candidates are laid out in ascending position (M_{c-1} lies before C_c), so ranking by score
    with ties to the lower index gives ties to the lower position, as the spec requires.
    """
    n_kv = scores.shape[0]
    local_start = max(chunk_start, chunk_end - local)
    local_idx = mx.broadcast_to(mx.arange(local_start, chunk_end, dtype=mx.int32),
                                (n_kv, chunk_end - local_start))
    chunk_rest = mx.broadcast_to(mx.arange(chunk_start, local_start, dtype=mx.int32),
                                 (n_kv, local_start - chunk_start))
    parts = [previous.indices.astype(mx.int32), chunk_rest] if previous is not None else [chunk_rest]
    candidates = mx.concatenate(parts, axis=1)
    n_heavy = min(heavy, candidates.shape[1])
    rows = [local_idx]
    if n_heavy > 0:
        order = descending_order(mx.take_along_axis(scores, candidates, axis=1))[:, :n_heavy]
        rows.append(mx.take_along_axis(candidates, order, axis=1))
    return MemorySet(mx.sort(mx.concatenate(rows, axis=1), axis=1), chunk_index)


def gather_memory(k: mx.array, v: mx.array, memory: MemorySet) -> tuple[mx.array, mx.array]:
    """Per-KV-head gather of the memory rows: k/v [Hkv, n, D] -> [Hkv, M, D]."""
    idx = memory.indices[:, :, None]
    return mx.take_along_axis(k, idx, axis=1), mx.take_along_axis(v, idx, axis=1)


def h2o_attention_batch(q: mx.array, k: mx.array, v: mx.array, carry: H2OCarry, config: H2OConfig,
                        scale: float, is_last: bool,
                        use_kernels: bool | None = None) -> tuple[mx.array, H2OCarry]:
    """One logical batch of one layer: phase 1 for all its chunks, then the phase-2 walk.

    q [Hq, T, D] holds the batch's queries, positions [carry.n_done, carry.n_done + T);
    k/v [Hkv, >= carry.n_done + T, D] hold every key so far (memory sets index back into them).
    is_last: the batch ends the prompt, so no memory set is built after its final chunk.
    """
    size = config.chunk_size
    start, n_tokens = carry.n_done, q.shape[1]
    n_kv = k.shape[0]
    if start % size != 0:
        raise ValueError(f"a logical batch must start on a chunk boundary, got position {start}")
    if k.shape[1] < start + n_tokens or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"k/v {k.shape} must hold the {start + n_tokens} keys up to this batch's end")
    intra = intra_attention(q, k[:, start:start + n_tokens], v[:, start:start + n_tokens], size, scale,
                            use_kernel=use_kernels)
    # every chunk's scores start from its own phase-1 column sums
    scores = mx.concatenate([carry.scores, reduce_colsum_to_kv_heads(intra.colsum, n_kv)], axis=1)
    memory, memory_sets = carry.memory, list(carry.memory_sets)
    outputs = []
    for local_start in range(0, n_tokens, size):
        local_end = min(local_start + size, n_tokens)
        chunk_start, chunk_end = start + local_start, start + local_end
        state: AttentionState = slice_state(intra.state, local_start, local_end)
        if memory is not None:
            k_mem, v_mem = gather_memory(k, v, memory)
            inter = inter_attention(q[:, local_start:local_end], k_mem, v_mem, scale, use_kernel=use_kernels)
            scores = accumulate_scores(scores, memory, reduce_colsum_to_kv_heads(inter.colsum, n_kv))
            state = merge_states(inter.state, state)
        outputs.append(state.o.astype(q.dtype))
        if is_last and local_end == n_tokens:
            break  # no memory set after the final chunk: nothing would read it
        if local_end - local_start != size:
            raise ValueError("only the final chunk of a prompt may be partial")
        memory = build_memory_set(scores, memory, chunk_start // size, chunk_start, chunk_end,
                                  config.local, config.heavy)
        memory_sets.append(memory)
    out = mx.concatenate(outputs, axis=1) if outputs else mx.zeros(q.shape, dtype=q.dtype)
    return out, H2OCarry(scores=scores, memory=memory, memory_sets=memory_sets)


def causal_attention(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """Plain causal attention [Hq, N, D] (GQA), for H2O disabled (L + H = 0)."""
    return mx.fast.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale, mask="causal")[0]


def h2o_attention_layer(q: mx.array, k: mx.array, v: mx.array, config: H2OConfig, scale: float,
                        use_kernels: bool | None = None) -> H2OLayerResult:
    """Whole-prompt H2O attention for one layer: q [Hq, N, D], k/v [Hkv, N, D] (post-RoPE),
    logical batch by logical batch. With L + H = 0 it is plain causal attention."""
    if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape or q.shape[1] != k.shape[1]:
        raise ValueError(f"h2o attention takes q [Hq, N, D] and k/v [Hkv, N, D]; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    n_tokens, n_kv = q.shape[1], k.shape[0]
    if not config.enabled or n_tokens == 0:
        output = causal_attention(q, k, v, scale) if n_tokens else mx.zeros(q.shape, dtype=q.dtype)
        return H2OLayerResult(output, mx.zeros((n_kv, n_tokens), dtype=mx.float32), [])
    carry = H2OCarry.start(n_kv)
    outputs = []
    for batch_start in range(0, n_tokens, config.batch_size):
        batch_end = min(batch_start + config.batch_size, n_tokens)
        out, carry = h2o_attention_batch(q[:, batch_start:batch_end], k, v, carry, config, scale,
                                         is_last=batch_end == n_tokens, use_kernels=use_kernels)
        outputs.append(out)
    return H2OLayerResult(mx.concatenate(outputs, axis=1), carry.scores, carry.memory_sets)
