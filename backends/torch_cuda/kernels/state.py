"""Online-softmax state of attention over one key block, in torch (see core/stages.py).

m, l are float32 (float64 for float64 inputs): statistics never drop below fp32; o keeps the
input dtype. Empty key blocks give m = -inf, l = 0, o = 0, and merging them changes nothing.
"""
from __future__ import annotations

import math
import torch

from specfill.core.stages import AttentionState, InterResult, IntraResult, KeyWindow

__all__ = ["LN2", "LOG2E", "AttentionState", "InterResult", "IntraResult", "KeyWindow", "empty_state",
           "merge_states", "softmax_state_", "stats_dtype"]

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def stats_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def empty_state(n_heads: int, n_tokens: int, head_dim: int, dtype: torch.dtype,
                device: torch.device, stats: torch.dtype = torch.float32) -> AttentionState:
    """Attention over no keys."""
    return AttentionState(
        m=torch.full((n_heads, n_tokens), -math.inf, dtype=stats, device=device),
        l=torch.zeros((n_heads, n_tokens), dtype=stats, device=device),
        o=torch.zeros((n_heads, n_tokens, head_dim), dtype=dtype, device=device),
    )


def merge_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """Exact merge of two states over disjoint key sets (FlashAttention's rescaling).

    Computed in the statistics dtype; o comes back in a.o's dtype. Rows empty in both stay empty.
    """
    stats = torch.promote_types(stats_dtype(a.o, b.o), torch.promote_types(a.m.dtype, b.m.dtype))
    m_a, m_b = a.m.to(stats), b.m.to(stats)
    m = torch.maximum(m_a, m_b)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    weight_a = a.l.to(stats) * torch.exp(m_a - m_safe)
    weight_b = b.l.to(stats) * torch.exp(m_b - m_safe)
    l = weight_a + weight_b
    inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l)).unsqueeze(-1)
    o = (weight_a.unsqueeze(-1) * inv) * a.o.to(stats) + (weight_b.unsqueeze(-1) * inv) * b.o.to(stats)
    return AttentionState(m, l, o.to(a.o.dtype))


def softmax_state_(logits2: torch.Tensor, v: torch.Tensor) -> tuple[AttentionState, torch.Tensor]:
    """State of softmax(logits) @ v over the visible keys, plus the normalised softmax weights.

    logits2 [..., R, K]: scaled logits times log2(e) (base-2 units, as the kernels use), -inf
    for hidden keys, in the statistics dtype and owned by the caller: they are turned into the
    weights in place. exp2 runs ~3x faster than exp on CPU. v [..., K, D]. m comes back in
    natural units. Rows with no visible key give m = -inf, l = 0, o = 0 and zero weights.
    """
    m2 = logits2.amax(dim=-1, keepdim=True)
    # a row with no visible key has max -inf: subtracting the lowest finite value keeps it at -inf
    weights = logits2.sub_(m2.clamp_min(torch.finfo(m2.dtype).min)).exp2_()
    l = weights.sum(dim=-1, keepdim=True)
    weights.mul_(torch.where(l > 0, 1.0 / l, torch.zeros_like(l)))
    return AttentionState(m2.squeeze(-1).mul_(LN2), l.squeeze(-1), weights @ v), weights
