"""Online-softmax state on MLX arrays and its exact merge (FlashAttention's rescaling).

The types are core.stages' (one set for every backend). Shapes: m, l [Hq, T] float32; o [Hq, T, D] normalised,
in the input dtype.
An empty state (no keys) is m = -inf, l = 0, o = 0 and merges as the identity.
"""

from __future__ import annotations

import mlx.core as mx

from specfill.core.stages import AttentionState


def empty_state(n_heads: int, n_tokens: int, head_dim: int, dtype: mx.Dtype) -> AttentionState:
    """The state of attention over no keys."""
    return AttentionState(
        m=mx.full((n_heads, n_tokens), -mx.inf, dtype=mx.float32),
        l=mx.zeros((n_heads, n_tokens), dtype=mx.float32),
        o=mx.zeros((n_heads, n_tokens, head_dim), dtype=dtype),
    )


def merge_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """Exact merge of two states over disjoint key sets; float32 statistics, no NaN when either
    or both are empty. The merged o keeps a.o's dtype."""
    a_m, b_m = a.m.astype(mx.float32), b.m.astype(mx.float32)
    m = mx.maximum(a_m, b_m)
    # both empty -> m = -inf; shift by 0 instead so exp() sees -inf, never (-inf) - (-inf)
    m_safe = mx.where(mx.isinf(m), mx.zeros_like(m), m)
    weight_a = a.l.astype(mx.float32) * mx.exp(a_m - m_safe)
    weight_b = b.l.astype(mx.float32) * mx.exp(b_m - m_safe)
    l = weight_a + weight_b
    denom = mx.where(l > 0, l, mx.ones_like(l))
    o = (weight_a[..., None] * a.o.astype(mx.float32) + weight_b[..., None] * b.o.astype(mx.float32)) / denom[..., None]
    return AttentionState(m=m, l=l, o=o.astype(a.o.dtype))


def slice_state(state: AttentionState, start: int, stop: int) -> AttentionState:
    """The state of query tokens [start, stop)."""
    return AttentionState(state.m[:, start:stop], state.l[:, start:stop], state.o[:, start:stop])


def soft_cap(logits: mx.array, softcap: float | None) -> mx.array:
    """A layer's logit soft-cap on scaled logits, BEFORE any mask: cap * tanh(logits / cap)."""
    return logits if softcap is None else mx.tanh(logits / softcap) * softcap


def sink_weights(logits: mx.array, m: mx.array, sinks: mx.array) -> mx.array:
    """Softmax weights of masked logits [..., K] (row max m [...]) with each row's sink (sinks
    broadcastable to m) in the denominator only, shifted by max(m, sink): finite, an empty row's
    weights 0. The twins' column sums and scores; their states stay sink-free (`add_sinks`)."""
    sinks = sinks.astype(mx.float32)
    top = mx.maximum(m, sinks)
    shifted = mx.exp(logits - top[..., None])
    return shifted / (shifted.sum(axis=-1) + mx.exp(sinks - top))[..., None]


def add_sinks(state: AttentionState, sinks: mx.array) -> AttentionState:
    """The state with each query head's sink logit (sinks [Hq]) in its denominator: exp(sink - m)
    joins l and no value joins o. For the state over a query's whole key set (merged states would
    count a sink twice). A row over no key becomes m = sink, l = 1, o = 0: finite."""
    m_old = state.m.astype(mx.float32)
    sink = sinks.astype(mx.float32).reshape(-1, *([1] * (m_old.ndim - 1)))
    m = mx.maximum(m_old, sink)
    kept = state.l.astype(mx.float32) * mx.exp(m_old - m)  # exp(-inf) = 0 for an empty row
    l = kept + mx.exp(sink - m)
    o = state.o.astype(mx.float32) * (kept / l)[..., None]
    return AttentionState(m=m, l=l, o=o.astype(state.o.dtype))
