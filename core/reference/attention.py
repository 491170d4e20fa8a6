"""Online-softmax building blocks shared by the H2O stages and full attention.

A layer's terms (core/stages.AttentionTerms): the soft-cap acts on the scaled logits before the
mask (`soft_cap`); a sink joins a softmax's denominator only. States (m, l, o) stay sink-free, so
that states over disjoint key sets still merge exactly; the sink is folded in once, into the state
over the query's whole key set (`add_sinks`), while the softmax weights a stage hands out (the
column sums, the scores) take it in their own denominator (`masked_state(..., sinks)`).
"""

from __future__ import annotations

import numpy as np

from ..stages import AttentionState


def accumulation_dtype(*arrays: np.ndarray) -> type:
    """float64 when any input is float64, else float32: statistics are never below fp32."""
    return np.float64 if any(np.asarray(a).dtype == np.float64 for a in arrays) else np.float32


def expand_kv_heads(x: np.ndarray, n_query_heads: int, axis: int = 0) -> np.ndarray:
    """Repeat each KV head for its G query heads: query head h reads KV head h // G."""
    n_kv = x.shape[axis]
    if n_query_heads % n_kv != 0:
        raise ValueError(f"{n_query_heads} query heads are not a multiple of {n_kv} KV heads")
    return np.repeat(x, n_query_heads // n_kv, axis=axis)


def soft_cap(logits: np.ndarray, softcap: float | None) -> np.ndarray:
    """cap * tanh(logits / cap) on scaled logits (gemma2's order: scale, cap, then the mask)."""
    if softcap is None:
        return logits
    cap = logits.dtype.type(softcap)
    return np.tanh(logits / cap) * cap


def masked_state(
    logits: np.ndarray, valid: np.ndarray, v: np.ndarray, sinks: np.ndarray | None = None
) -> tuple[AttentionState, np.ndarray]:
    """State of softmax(logits) @ v over the valid keys, plus the softmax weights.

    logits [..., T, K] (already scaled), valid broadcastable to it, v [..., K, D].
    Rows with no valid key give m = -inf, l = 0, o = 0 and all-zero weights (no NaN).
    sinks broadcastable to [..., T]: each row's sink logit joins the WEIGHTS' denominator
    (exp(s_j) / (sum_k exp(s_k) + exp(sink))), shifted by max(m, sink) so that nothing overflows;
    the state stays sink-free (`add_sinks` folds it in once, see the module doc).
    """
    logits = np.where(valid, logits, -np.inf)
    m = logits.max(axis=-1)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(logits - m_safe[..., None])
    l = p.sum(axis=-1)
    weights = p / np.where(l > 0, l, 1.0)[..., None]
    o = weights @ v
    if sinks is not None:
        top = np.maximum(m, np.broadcast_to(np.asarray(sinks, logits.dtype), m.shape))  # finite
        shifted = np.exp(logits - top[..., None])
        weights = shifted / (shifted.sum(axis=-1) + np.exp(np.asarray(sinks, logits.dtype) - top))[..., None]
    return AttentionState(m=m, l=l, o=o), weights


def add_sinks(state: AttentionState, sinks: np.ndarray) -> AttentionState:
    """The state with each query head's sink logit (sinks [Hq]) joined to its denominator: the
    sink adds exp(sink - m) to l and no value, so o shrinks by l / (l + exp(sink - m)). A row over
    no key becomes m = sink, l = 1, o = 0 (finite). Apply once, to the state over a query's whole
    key set: states over disjoint key sets merge exactly only while sink-free."""
    sink = np.asarray(sinks, dtype=state.l.dtype).reshape(-1, *([1] * (state.m.ndim - 1)))
    m = np.maximum(state.m, sink)
    kept = state.l * np.exp(state.m - m)  # exp(-inf) = 0 for an empty row
    l = kept + np.exp(sink - m)
    o = state.o * (kept / l)[..., None]
    return AttentionState(m=m, l=l, o=o.astype(state.o.dtype, copy=False))


def empty_state(n_heads: int, n_tokens: int, head_dim: int, dtype: type) -> AttentionState:
    """The state of attention over no keys: merging it changes nothing."""
    return AttentionState(
        m=np.full((n_heads, n_tokens), -np.inf, dtype=dtype),
        l=np.zeros((n_heads, n_tokens), dtype=dtype),
        o=np.zeros((n_heads, n_tokens, head_dim), dtype=dtype),
    )


def merge_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """Exact merge of two states over disjoint key sets (FlashAttention's rescaling)."""
    m = np.maximum(a.m, b.m)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    weight_a = a.l * np.exp(a.m - m_safe)
    weight_b = b.l * np.exp(b.m - m_safe)
    l = weight_a + weight_b
    o = (weight_a[..., None] * a.o + weight_b[..., None] * b.o) / np.where(l > 0, l, 1.0)[..., None]
    return AttentionState(m=m, l=l, o=o.astype(a.o.dtype, copy=False))


def slice_state(state: AttentionState, start: int, stop: int) -> AttentionState:
    """The state of query tokens [start, stop)."""
    return AttentionState(state.m[:, start:stop], state.l[:, start:stop], state.o[:, start:stop])
