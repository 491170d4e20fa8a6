"""Phase 1 of H2O: block-diagonal causal attention of every chunk at once.

Query i (chunk c = i // S) sees keys j with j // S == c and j <= i. Returns the online-softmax
state per query and query head plus, per key j, the column sum over the queries of j's chunk
of the intra-only softmax, and the GQA reduction of those sums to KV heads.
Triton kernel (kernels/flash_triton.py) and torch twin, chosen by `intra_attention`.
"""
from __future__ import annotations

import math

import torch

from .dispatch import use_triton
from .state import AttentionResult, AttentionState, empty_state, softmax_state_, stats_dtype

# logits kept alive at once by the twin: chunks are processed in groups of about this many floats
_TWIN_LOGITS_BUDGET = 1 << 25


def check_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q [Hq, T, D], k/v [Hkv, K, D] with Hq a multiple of Hkv."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"attention takes q [Hq, T, D] and k/v [Hkv, K, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"k/v shapes {tuple(k.shape)}, {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if k.shape[0] == 0 or q.shape[0] % k.shape[0] != 0:
        raise ValueError(f"{q.shape[0]} query heads are not a multiple of {k.shape[0]} KV heads")


def reduce_colsum_to_kv_heads(colsum: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[Hq, X] -> [Hkv, X]: sum over the G query heads that share each KV head."""
    n_heads = colsum.shape[0]
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    return colsum.reshape(n_kv_heads, n_heads // n_kv_heads, *colsum.shape[1:]).sum(dim=1)


def intra_attention_twin(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int,
                         scale: float, with_colsum: bool = True) -> AttentionResult:
    """Torch-ops twin of the phase-1 kernel: explicit logits per chunk, fp32 statistics.

    The G query heads of a KV head are stacked as rows of one matmul against that head's keys,
    so K/V are never repeated.
    """
    n_heads, n_tokens, head_dim = q.shape
    n_kv = k.shape[0]
    group = n_heads // n_kv
    stats = stats_dtype(q, k, v)
    chunk_size = min(chunk_size, n_tokens)  # one short chunk: no padding to a full one
    n_chunks = math.ceil(n_tokens / chunk_size)
    pad = n_chunks * chunk_size - n_tokens

    def chunked(x: torch.Tensor) -> torch.Tensor:  # [H, T, D] -> [H, C, S, D] in stats dtype
        x = torch.nn.functional.pad(x.to(stats), (0, 0, 0, pad))
        return x.reshape(x.shape[0], n_chunks, chunk_size, head_dim)

    # [Hkv, C, G*S, D]: row g*S + i of chunk c is query i of head kv*G + g (q pre-scaled)
    qc = (chunked(q) * scale).reshape(n_kv, group, n_chunks, chunk_size, head_dim).transpose(1, 2)
    qc = qc.reshape(n_kv, n_chunks, group * chunk_size, head_dim)
    kc, vc = chunked(k), chunked(v)
    local = torch.arange(chunk_size, device=q.device)
    causal = (local[None, :] <= local[:, None]).repeat(group, 1)  # [G*S, S]
    real = (torch.arange(n_chunks * chunk_size, device=q.device) < n_tokens).reshape(n_chunks, chunk_size)

    o = torch.empty((n_kv, n_chunks, group * chunk_size, head_dim), dtype=stats, device=q.device)
    m = torch.empty((n_kv, n_chunks, group * chunk_size), dtype=stats, device=q.device)
    l = torch.empty_like(m)
    colsum = torch.empty((n_kv, n_chunks, group, chunk_size), dtype=stats, device=q.device) if with_colsum else None
    per_group = max(1, _TWIN_LOGITS_BUDGET // (n_heads * chunk_size * chunk_size))
    for c0 in range(0, n_chunks, per_group):
        c1 = min(n_chunks, c0 + per_group)
        logits = qc[:, c0:c1] @ kc[:, c0:c1].transpose(-1, -2)
        hidden = ~(causal[None, :, :] & real[c0:c1, None, :])  # [c, G*S, S]
        state, weights = softmax_state_(logits, hidden[None], vc[:, c0:c1])
        m[:, c0:c1], l[:, c0:c1], o[:, c0:c1] = state
        if colsum is not None:
            weights = weights.view(n_kv, c1 - c0, group, chunk_size, chunk_size)
            if c1 == n_chunks and pad:
                weights[:, -1, :, chunk_size - pad:] = 0  # padded query rows see real keys: no vote
            colsum[:, c0:c1] = weights.sum(dim=3)

    def per_query_head(x: torch.Tensor) -> torch.Tensor:  # [Hkv, C, G*S, ...] -> [Hq, T, ...]
        x = x.reshape(n_kv, n_chunks, group, chunk_size, *x.shape[3:]).transpose(1, 2)
        return x.reshape(n_heads, n_chunks * chunk_size, *x.shape[4:])[:, :n_tokens]

    state = AttentionState(per_query_head(m), per_query_head(l), per_query_head(o).to(q.dtype))
    if colsum is not None:
        colsum = colsum.transpose(1, 2).reshape(n_heads, n_chunks * chunk_size)[:, :n_tokens]
    return AttentionResult(state, colsum)


def intra_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int, scale: float,
                    use_kernel: bool | None = None, with_colsum: bool = True) -> AttentionResult:
    """Phase-1 attention: q [Hq, T, D], k/v [Hkv, T, D]; chunks of chunk_size start at token 0.

    Returns m, l [Hq, T] (fp32; fp64 for fp64 inputs), o [Hq, T, D] in q's dtype and column sums
    [Hq, T] (None when with_colsum is False). use_kernel: None = Triton on CUDA, else the twin;
    True / False force one.
    """
    check_attention_shapes(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"intra attention needs one key per query, got {q.shape[1]} queries, {k.shape[1]} keys")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    kernel = use_triton(use_kernel, q, k, v)
    if q.shape[1] == 0:
        stats = stats_dtype(q, k, v)
        state = empty_state(q.shape[0], 0, q.shape[2], q.dtype, q.device, stats)
        return AttentionResult(state, state.l.clone() if with_colsum else None)
    if kernel:
        from .flash_triton import flash_attention

        return flash_attention(q, k, v, scale, chunk_size, with_colsum)
    return intra_attention_twin(q, k, v, chunk_size, scale, with_colsum)
