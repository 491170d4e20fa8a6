"""H2O two-phase chunked sparse prefill of one layer, in torch (seed 001; spec: core/reference/h2o.py).

For query i in chunk C_c the keys are K(i) = {j in C_c : j <= i} U M_{c-1}. Phase 1 runs the
block-diagonal intra attention of every chunk of a logical batch at once; phase 2 walks the
chunks in order: attend to the previous memory set, add its column sums to the scores, merge
exactly, build the next memory set. The model runtime calls `h2o_attention_layer` per layer
with the layer's post-RoPE q/k/v (or `h2o_attention_batch` per logical batch with a carry).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specfill.core.config import H2OConfig

from .kernels.cpu_units import units_scope
from .kernels.dispatch import use_triton
from .kernels.inter import inter_attention
from .kernels.intra import check_attention_shapes, intra_attention, reduce_colsum_to_kv_heads
from .kernels.state import merge_states, stats_dtype

__all__ = ["H2OCarry", "H2OLayerOutput", "accumulate_scores", "build_memory_set", "causal_attention",
           "gather_memory", "h2o_attention_batch", "h2o_attention_layer", "local_window", "merge_states",
           "reduce_colsum_to_kv_heads"]


@dataclass
class H2OCarry:
    """What one layer carries from one logical batch to the next.

    scores: [Hkv, n_done] accumulated score per processed prompt position (fp32, fp64 for fp64).
    memory: [Hkv, M] int64, the memory set the next chunk attends to (None before chunk 0 ends).
    memory_sets: every memory set built so far, in chunk order.
    """

    scores: torch.Tensor
    memory: torch.Tensor | None = None
    memory_sets: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def start(cls, n_kv_heads: int, device: torch.device, dtype: torch.dtype = torch.float32) -> H2OCarry:
        return cls(torch.zeros((n_kv_heads, 0), dtype=dtype, device=device))

    @property
    def n_done(self) -> int:
        return int(self.scores.shape[1])


class H2OLayerOutput(NamedTuple):
    """output [Hq, N, D] in q's dtype; scores [Hkv, N]; memory_sets M_0 .. M_{k-2}, each [Hkv, M]."""

    output: torch.Tensor
    scores: torch.Tensor
    memory_sets: list[torch.Tensor]


def accumulate_scores(scores: torch.Tensor, memory: torch.Tensor, kv_colsum: torch.Tensor) -> torch.Tensor:
    """scores [Hkv, n] with scores[g, memory[g, s]] += kv_colsum[g, s], as a new tensor."""
    return scores.scatter_add(1, memory, kv_colsum.to(scores.dtype))


def local_window(chunk_start: int, chunk_end: int, local: int, device: torch.device) -> torch.Tensor:
    """The tail `local` positions of the chunk [chunk_start, chunk_end)."""
    return torch.arange(max(chunk_start, chunk_end - local), chunk_end, dtype=torch.int64, device=device)


def build_memory_set(scores: torch.Tensor, previous: torch.Tensor | None, chunk_start: int,
                     chunk_end: int, local: int, heavy: int) -> torch.Tensor:
    """M_c = Local_c U top-H((M_{c-1} U C_c) minus Local_c) per KV head: [Hkv, L + H] ascending.

    Heavy hitters rank by score, ties to the lower position: the candidates are laid out in
    ascending position and a stable descending sort keeps that order among equal scores.
    """
    n_kv, device = scores.shape[0], scores.device
    local_idx = local_window(chunk_start, chunk_end, local, device).expand(n_kv, -1)
    local_start = chunk_end - local_idx.shape[1]
    rest = torch.arange(chunk_start, local_start, dtype=torch.int64, device=device).expand(n_kv, -1)
    # M_{c-1} lies before C_c, so [previous, rest] is ascending in every row
    candidates = rest if previous is None else torch.cat([previous.to(torch.int64), rest], dim=1)
    n_heavy = min(heavy, candidates.shape[1])
    if n_heavy == 0:
        return local_idx.contiguous()
    ranked = torch.sort(scores.gather(1, candidates), dim=1, descending=True, stable=True).indices
    heavy_idx = candidates.gather(1, ranked[:, :n_heavy])
    return torch.cat([heavy_idx, local_idx], dim=1).sort(dim=1).values


def gather_memory(k: torch.Tensor, v: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k/v [Hkv, n, D] -> k_mem/v_mem [Hkv, M, D]: row g gathers positions memory[g]."""
    index = memory.unsqueeze(-1).expand(-1, -1, k.shape[-1])
    return k.gather(1, index), v.gather(1, index)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     use_kernels: bool | None = None) -> torch.Tensor:
    """Plain causal attention [Hq, N, D]: torch SDPA (its fused kernels on CUDA), or the intra
    kernel with one chunk when kernels are forced."""
    check_attention_shapes(q, k, v)
    if use_kernels and use_triton(True, q, k, v):
        return intra_attention(q, k, v, max(1, q.shape[1]), scale, use_kernel=True, with_colsum=False).state.o
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                          enable_gqa=q.shape[0] != k.shape[0])


def h2o_attention_batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, carry: H2OCarry,
                        config: H2OConfig, scale: float, is_last: bool,
                        use_kernels: bool | None = None) -> tuple[torch.Tensor, H2OCarry]:
    """One logical batch of one layer: phase 1 for all its chunks, then the phase-2 walk.

    q [Hq, T, D] are the batch's queries, positions [carry.n_done, carry.n_done + T);
    k/v [Hkv, >= carry.n_done + T, D] hold every key so far (memory sets point back into them).
    Returns the batch's output [Hq, T, D] and the carry for the next batch.
    """
    size = config.chunk_size
    start, n_tokens = carry.n_done, q.shape[1]
    n_kv = k.shape[0]
    if start % size != 0:
        raise ValueError(f"a logical batch must start on a chunk boundary, got position {start}")
    if k.shape[1] < start + n_tokens:
        raise ValueError(f"k/v hold {k.shape[1]} positions, the batch needs {start + n_tokens}")
    with units_scope(q.device):  # many small ops on CPU: one thread team per stage, not per op
        intra = intra_attention(q, k[:, start:start + n_tokens], v[:, start:start + n_tokens], size, scale,
                                use_kernel=use_kernels)
        # every chunk's scores start from its phase-1 column sums; phase 2 adds to them in place
        scores = torch.cat([carry.scores, reduce_colsum_to_kv_heads(intra.colsum, n_kv).to(carry.scores.dtype)],
                           dim=1)
        memory, memory_sets = carry.memory, list(carry.memory_sets)
        out = intra.state.o  # chunks with a memory set are overwritten by their merged output
        for local_start in range(0, n_tokens, size):
            local_end = min(local_start + size, n_tokens)
            chunk_start, chunk_end = start + local_start, start + local_end
            if memory is not None:
                k_mem, v_mem = gather_memory(k, v, memory)
                inter = inter_attention(q[:, local_start:local_end], k_mem, v_mem, scale, use_kernel=use_kernels)
                scores.scatter_add_(1, memory, reduce_colsum_to_kv_heads(inter.colsum, n_kv).to(scores.dtype))
                merged = merge_states(inter.state, intra.state.rows(local_start, local_end))
                out[:, local_start:local_end] = merged.o
            if is_last and local_end == n_tokens:
                break  # no memory set after the final chunk: nothing would read it
            if local_end - local_start != size:
                raise ValueError("only the final chunk of a prompt may be partial")
            memory = build_memory_set(scores, memory, chunk_start, chunk_end, config.local, config.heavy)
            memory_sets.append(memory)
    return out, H2OCarry(scores=scores, memory=memory, memory_sets=memory_sets)


def h2o_attention_layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: H2OConfig,
                        scale: float, use_kernels: bool | None = None) -> H2OLayerOutput:
    """Whole-prompt H2O attention of one layer: q [Hq, N, D], k/v [Hkv, N, D] after RoPE.

    Logical batch by logical batch (config.batch_size), carrying scores and memory sets.
    N <= S is plain causal attention (one chunk, no memory); H2O disabled (L + H = 0) is plain
    causal attention with zero scores, as in the llama.cpp plan.
    use_kernels: None = Triton on CUDA, else the torch twins; True / False force one.
    """
    check_attention_shapes(q, k, v)
    n_tokens, n_kv = q.shape[1], k.shape[0]
    if k.shape[1] != n_tokens:
        raise ValueError(f"{n_tokens} queries but {k.shape[1]} keys: one layer's prompt q/k/v must align")
    stats = stats_dtype(q, k, v)
    if n_tokens == 0 or not config.enabled:
        output = causal_attention(q, k, v, scale, use_kernels)
        return H2OLayerOutput(output, torch.zeros((n_kv, n_tokens), dtype=stats, device=q.device), [])
    carry = H2OCarry.start(n_kv, q.device, stats)
    outputs = []
    for batch_start in range(0, n_tokens, config.batch_size):
        batch_end = min(batch_start + config.batch_size, n_tokens)
        out, carry = h2o_attention_batch(q[:, batch_start:batch_end], k, v, carry, config, scale,
                                         is_last=batch_end == n_tokens, use_kernels=use_kernels)
        outputs.append(out)
    output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return H2OLayerOutput(output, carry.scores, carry.memory_sets)
