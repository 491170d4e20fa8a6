"""Phase 2 of H2O: one chunk's queries against the previous memory set, gathered per KV head.

No mask: every query of the chunk sees every memory slot of its KV head. Returns the
online-softmax state and, per memory slot, the column sum over the chunk's queries.
Triton kernel (kernels/flash_triton.py) and torch twin, chosen by `inter_attention`.
"""
from __future__ import annotations

import torch

from .dispatch import use_triton
from .intra import check_attention_shapes
from .state import AttentionResult, empty_state, softmax_state_, stats_dtype


def inter_attention_twin(q: torch.Tensor, k_mem: torch.Tensor, v_mem: torch.Tensor, scale: float,
                         with_colsum: bool = True) -> AttentionResult:
    """Torch-ops twin: the G query heads of a KV head are the rows of one matmul."""
    n_heads, n_tokens, head_dim = q.shape
    n_kv, n_mem = k_mem.shape[0], k_mem.shape[1]
    group = n_heads // n_kv
    stats = stats_dtype(q, k_mem, v_mem)
    rows = (q.to(stats) * scale).reshape(n_kv, group * n_tokens, head_dim)
    logits = rows @ k_mem.to(stats).transpose(-1, -2)  # [Hkv, G*T, M]
    state, weights = softmax_state_(logits, None, v_mem.to(stats))
    m, l, o = (x.reshape(n_heads, n_tokens, *x.shape[2:]) for x in state)
    colsum = weights.reshape(n_heads, n_tokens, n_mem).sum(dim=1) if with_colsum else None
    return AttentionResult(type(state)(m, l, o.to(q.dtype)), colsum)


def inter_attention(q: torch.Tensor, k_mem: torch.Tensor, v_mem: torch.Tensor, scale: float,
                    use_kernel: bool | None = None, with_colsum: bool = True) -> AttentionResult:
    """q [Hq, T, D] against k_mem/v_mem [Hkv, M, D] -> m, l [Hq, T], o [Hq, T, D], colsum [Hq, M].

    An empty memory (M = 0) gives the empty state (m = -inf, l = 0, o = 0) and no column sums.
    use_kernel: None = Triton on CUDA, else the twin; True / False force one.
    """
    check_attention_shapes(q, k_mem, v_mem)
    kernel = use_triton(use_kernel, q, k_mem, v_mem)
    if k_mem.shape[1] == 0:
        stats = stats_dtype(q, k_mem, v_mem)
        state = empty_state(q.shape[0], q.shape[1], q.shape[2], q.dtype, q.device, stats)
        colsum = torch.zeros((q.shape[0], 0), dtype=stats, device=q.device) if with_colsum else None
        return AttentionResult(state, colsum)
    if kernel:
        from .flash_triton import flash_attention

        return flash_attention(q, k_mem, v_mem, scale, None, with_colsum)
    return inter_attention_twin(q, k_mem, v_mem, scale, with_colsum)
