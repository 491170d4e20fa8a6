"""Online-softmax state of attention over one key block, in torch (see core/stages.py).

m, l are float32 (float64 for float64 inputs): statistics never drop below fp32; o keeps the
input dtype. Empty key blocks give m = -inf, l = 0, o = 0, and merging them changes nothing.
"""

from __future__ import annotations

import math

import torch

from specfill.core.stages import AttentionState

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def stats_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def empty_state(
    n_heads: int,
    n_tokens: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    stats: torch.dtype = torch.float32,
) -> AttentionState:
    """Attention over no keys."""
    return AttentionState(
        m=torch.full((n_heads, n_tokens), -math.inf, dtype=stats, device=device),
        l=torch.zeros((n_heads, n_tokens), dtype=stats, device=device),
        o=torch.zeros((n_heads, n_tokens, head_dim), dtype=dtype, device=device),
    )


def stacked_buffers(
    q: torch.Tensor, n_kv: int, value_dim: int, stats: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A twin's uninitialised state buffers with the G query heads of a KV head stacked (q [Hq, T, D]):
    m, l [Hkv, G, T] and o [Hkv, G, T, Dv], in the statistics dtype on q's device."""
    n_heads, n_tokens = q.shape[:2]
    o = torch.empty((n_kv, n_heads // n_kv, n_tokens, value_dim), dtype=stats, device=q.device)
    m = torch.empty((n_kv, n_heads // n_kv, n_tokens), dtype=stats, device=q.device)
    return m, torch.empty_like(m), o


def unstacked_state(m: torch.Tensor, l: torch.Tensor, o: torch.Tensor, dtype: torch.dtype) -> AttentionState:
    """stacked_buffers' m, l, o once filled, as the stage's state: m, l [Hq, T], o [Hq, T, Dv] in `dtype`."""
    n_kv, group, n_tokens = m.shape
    return AttentionState(
        m.view(n_kv * group, n_tokens),
        l.view(n_kv * group, n_tokens),
        o.view(n_kv * group, n_tokens, o.shape[-1]).to(dtype),
    )


def merge_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """Exact merge of two states over disjoint key sets (FlashAttention's rescaling).

    a and b hold the same query rows. Computed in the statistics dtype; o comes back in a.o's
    dtype. Rows empty in both stay empty. Elementwise: merging many chunks' rows at once gives
    each row what merging it alone would.
    """
    stats = torch.promote_types(stats_dtype(a.o, b.o), torch.promote_types(a.m.dtype, b.m.dtype))
    # both states' statistics stacked [2, rows]: each step below is one launch for the two (the walk
    # is launch-bound on a GPU); the max, the sum of two and every product give the same bits
    m_ab = torch.stack([a.m.to(stats), b.m.to(stats)])
    m = m_ab.amax(dim=0)
    # non-finite maxima (rows empty in both) shift by 0; one op, where isfinite + where took six
    m_safe = torch.nan_to_num(m, nan=0.0, posinf=0.0, neginf=0.0)
    weights = torch.stack([a.l.to(stats), b.l.to(stats)]) * torch.exp(m_ab - m_safe)
    l = weights.sum(dim=0)
    inv = torch.where(l > 0, l.reciprocal(), 0.0)  # 1.0 / l is reciprocal() * 1.0: the same bits
    scaled = (weights * inv).unsqueeze(-1)
    o = scaled[0] * a.o.to(stats) + scaled[1] * b.o.to(stats)
    return AttentionState(m, l, o.to(a.o.dtype))


def soft_cap2_(logits2: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """A layer's logit soft-cap on base-2 logits (scaled logits times log2(e)), in place, BEFORE
    any mask: cap * tanh(s / cap) in natural units is c2 * tanh(s2 / c2) with c2 = cap * log2(e)."""
    if softcap is None:
        return logits2
    cap2 = float(softcap) * LOG2E
    return logits2.div_(cap2).tanh_().mul_(cap2)


def softmax_state_(
    logits2: torch.Tensor, v: torch.Tensor, sinks2: torch.Tensor | None = None
) -> tuple[AttentionState, torch.Tensor]:
    """State of softmax(logits) @ v over the visible keys, plus the normalised softmax weights.

    logits2 [..., R, K]: scaled logits times log2(e) (base-2 units, as the kernels use), -inf
    for hidden keys, in the statistics dtype and owned by the caller: they are turned into the
    weights in place. exp2 runs ~3x faster than exp on CPU. v [..., K, D]. m comes back in
    natural units. Rows with no visible key give m = -inf, l = 0, o = 0 and zero weights.
    sinks2 [..., R, 1] (base-2 units): each row's sink joins the WEIGHTS' denominator only; the
    state stays sink-free (`add_sinks` folds it in once, over a query's whole key set).
    """
    m2 = logits2.amax(dim=-1, keepdim=True)
    # a row with no visible key has max -inf: subtracting the lowest finite value keeps it at -inf
    shift = m2.clamp_min(torch.finfo(m2.dtype).min)
    weights = logits2.sub_(shift).exp2_()
    l = weights.sum(dim=-1, keepdim=True)
    if sinks2 is None:
        weights.mul_(torch.where(l > 0, 1.0 / l, torch.zeros_like(l)))
        return AttentionState(m2.squeeze(-1).mul_(LN2), l.squeeze(-1), weights @ v), weights
    o = (weights * torch.where(l > 0, 1.0 / l, torch.zeros_like(l))) @ v
    # an empty row's weights are 0 whatever the denominator (an overflow to inf included)
    weights.div_(l + torch.exp2(sinks2.to(l.dtype) - shift))
    return AttentionState(m2.squeeze(-1).mul_(LN2), l.squeeze(-1), o), weights


def add_sinks(state: AttentionState, sinks: torch.Tensor) -> AttentionState:
    """The state with each query head's sink logit (sinks [Hq]) in its denominator: exp(sink - m)
    joins l and no value joins o. For the state over a query's whole key set (merged states
    would count a sink twice). A row over no key becomes m = sink, l = 1, o = 0: finite."""
    stats = torch.promote_types(stats_dtype(state.o), state.m.dtype)
    m_old = state.m.to(stats)
    sink = sinks.to(device=m_old.device, dtype=stats).reshape(-1, *([1] * (m_old.dim() - 1)))
    m = torch.maximum(m_old, sink)
    kept = state.l.to(stats) * torch.exp(m_old - m)  # exp(-inf) = 0 for an empty row
    l = kept + torch.exp(sink - m)
    o = state.o.to(stats) * (kept / l).unsqueeze(-1)
    return AttentionState(m, l, o.to(state.o.dtype))
