"""Speculative-prefill scoring: each scoring query's softmax over the prompt keys, per layer.

queries [n_l, n_q, Hq, D] (last prompt token + look-ahead tokens), keys [n_l, Hkv, P, D]
-> probs [n_q, n_l, Hq, P] float32 (the layout core.reference.specprefill uses).
"""

from __future__ import annotations

import mlx.core as mx

from specfill.core.stages import active_terms, sinks_of, softcap_of

from .dispatch import SELF_CHECK, choose_kernel, common_dtype, kernel_runs, metal_kernels
from .state import sink_weights, soft_cap

THREADS_PER_GROUP = 64

# One thread per (query head h, scoring query qi, layer): online max and sum over the P keys.
SCORING_STATS_SOURCE = """
    const int h = int(thread_position_in_grid.x);
    const int qi = int(thread_position_in_grid.y);
    const int layer = int(thread_position_in_grid.z);
    if (h >= n_heads) {
        return;
    }
    const int g = h / G;
    const size_t row = (size_t(layer) * n_queries + qi) * n_heads + h;
    auto q_row = queries + row * D;
    auto k_head = keys + (size_t(layer) * (n_heads / G) + g) * n_keys * D;
    float q_reg[D];
    for (int d = 0; d < D; ++d) {
        q_reg[d] = static_cast<float>(q_row[d]);
    }
    float m_run = 0.0f;
    float l_run = 0.0f;
    for (int p = 0; p < n_keys; ++p) {
        auto k_row = k_head + size_t(p) * D;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) {
            s += q_reg[d] * static_cast<float>(k_row[d]);
        }
        s *= scale;
        if (p == 0) {
            m_run = s;
            l_run = 1.0f;
        } else if (s > m_run) {
            l_run = l_run * metal::exp(m_run - s) + 1.0f;
            m_run = s;
        } else {
            l_run += metal::exp(s - m_run);
        }
    }
    m_out[row] = m_run;
    l_out[row] = l_run;
"""

# One thread per (key p, query head h, layer * n_queries + qi): the normalised probability.
SCORING_PROBS_SOURCE = """
    const int p = int(thread_position_in_grid.x);
    const int h = int(thread_position_in_grid.y);
    const int lq = int(thread_position_in_grid.z);
    if (p >= n_keys || h >= n_heads) {
        return;
    }
    const int layer = lq / n_queries;
    const int qi = lq % n_queries;
    const int g = h / G;
    const size_t row = size_t(lq) * n_heads + h;
    auto q_row = queries + row * D;
    auto k_row = keys + ((size_t(layer) * (n_heads / G) + g) * n_keys + p) * D;
    float s = 0.0f;
    for (int d = 0; d < D; ++d) {
        s += static_cast<float>(q_row[d]) * static_cast<float>(k_row[d]);
    }
    s *= scale;
    const size_t out = ((size_t(qi) * n_layers + layer) * n_heads + h) * n_keys + p;
    probs[out] = metal::exp(s - m_in[row]) / l_in[row];
"""

SCORING_STATS_SPEC = dict(
    name="specfill_scoring_stats",
    input_names=["queries", "keys", "n_queries", "n_heads", "n_keys", "scale"],
    output_names=["m_out", "l_out"],
    source=SCORING_STATS_SOURCE,
)
SCORING_PROBS_SPEC = dict(
    name="specfill_scoring_probs",
    input_names=["queries", "keys", "m_in", "l_in", "n_layers", "n_queries", "n_heads", "n_keys", "scale"],
    output_names=["probs"],
    source=SCORING_PROBS_SOURCE,
)


_make_scoring_kernel = metal_kernels(SCORING_STATS_SPEC, SCORING_PROBS_SPEC)  # (row statistics, probabilities)


def _check(queries: mx.array, keys: mx.array) -> None:
    if queries.ndim != 4 or keys.ndim != 4:
        raise ValueError(
            f"scoring takes queries [n_l, n_q, Hq, D] and keys [n_l, Hkv, P, D]; got {queries.shape} and {keys.shape}"
        )
    if queries.shape[0] != keys.shape[0] or queries.shape[3] != keys.shape[3] or queries.shape[2] % keys.shape[1] != 0:
        raise ValueError(
            f"queries {queries.shape} do not match keys {keys.shape} (same layers and D, Hq a multiple of Hkv)"
        )
    common_dtype(queries, keys)


def attention_scores_kernel(queries: mx.array, keys: mx.array, scale: float) -> mx.array:
    """The Metal path (needs Metal and P >= 1)."""
    dtype = queries.dtype
    n_layers, n_queries, n_heads, head_dim = queries.shape
    n_keys = keys.shape[2]
    stats, probs_kernel = _make_scoring_kernel()
    template = [("InT", dtype), ("D", head_dim), ("G", n_heads // keys.shape[1])]
    m, l = stats(
        inputs=[queries, keys, n_queries, n_heads, n_keys, float(scale)],
        template=template,
        grid=(n_heads, n_queries, n_layers),
        threadgroup=(min(THREADS_PER_GROUP, n_heads), 1, 1),
        output_shapes=[(n_layers, n_queries, n_heads)] * 2,
        output_dtypes=[mx.float32] * 2,
    )
    (probs,) = probs_kernel(
        inputs=[queries, keys, m, l, n_layers, n_queries, n_heads, n_keys, float(scale)],
        template=template,
        grid=(n_keys, n_heads, n_layers * n_queries),
        threadgroup=(min(THREADS_PER_GROUP, n_keys), 1, 1),
        output_shapes=[(n_queries, n_layers, n_heads, n_keys)],
        output_dtypes=[mx.float32],
    )
    return probs


def attention_scores_twin(queries, keys, scale, window=None, terms=None, query_start=None) -> mx.array:
    """The MLX-ops twin (the stage's arguments, P >= 1), float32, GQA by broadcasting; the mask
    only with a window or an observation window's queries, the soft-cap before it."""
    n_layers, n_queries, n_heads, head_dim = queries.shape
    n_kv = keys.shape[1]
    # [n_l, n_q, Hq, D] -> [n_l, Hkv, G, n_q, D]
    q = queries.astype(mx.float32).reshape(n_layers, n_queries, n_kv, n_heads // n_kv, head_dim)
    q = q.transpose(0, 2, 3, 1, 4)
    logits = soft_cap(
        (q @ keys.astype(mx.float32)[:, :, None].swapaxes(-1, -2)) * scale, softcap_of(terms)
    )  # [n_l, Hkv, G, n_q, P]
    n_keys = keys.shape[2]
    if window is not None or (query_start is not None and query_start < n_keys - 1):
        start = n_keys - 1 if query_start is None else query_start
        distance = (start + mx.arange(n_queries))[:, None] - mx.arange(n_keys)[None, :]  # [n_q, P]
        visible = distance >= 0 if window is None else (distance >= 0) & (distance < window)
        logits = mx.where(visible, logits, -mx.inf)
    if sinks_of(terms) is not None:
        probs = sink_weights(logits, logits.max(axis=-1), sinks_of(terms).reshape(1, n_kv, n_heads // n_kv, 1))
        return probs.reshape(n_layers, n_heads, n_queries, -1).transpose(2, 0, 1, 3)
    top = logits.max(axis=-1, keepdims=True)
    weights = mx.exp(logits - mx.where(mx.isinf(top), 0.0, top))
    total = weights.sum(axis=-1, keepdims=True)
    probs = weights / mx.where(total > 0, total, 1.0)
    return probs.reshape(n_layers, n_heads, n_queries, -1).transpose(2, 0, 1, 3)


def attention_scores(
    queries, keys, scale, use_kernel: bool | None = None, window=None, terms=None, query_start=None
) -> mx.array:
    """The stage ScoringStageOps.attention_scores (core/stages.py) on MLX arrays, float32. use_kernel
    as intra_attention's; the Metal kernel masks nothing (a window, query_start) and takes no
    attention terms (said once): those run the twin."""
    _check(queries, keys)
    use = choose_kernel(
        use_kernel,
        "speculative-prefill scoring",
        self_check=lambda: _self_check(queries, queries.shape[2] // keys.shape[1]),
    )
    n_layers, n_queries, n_heads, _ = queries.shape
    if keys.shape[2] == 0 or n_queries == 0 or n_layers == 0:
        return mx.zeros((n_queries, n_layers, n_heads, keys.shape[2]), dtype=mx.float32)
    terms = active_terms(terms)
    if kernel_runs("speculative-prefill scoring", use, terms, window is not None or query_start is not None):
        return attention_scores_kernel(queries, keys, scale)
    return attention_scores_twin(queries, keys, scale, window, terms, query_start)


def _self_check(like: mx.array, group: int) -> bool:
    """The scoring kernel against its twin on the small fixed case (core/self_check_cases.py)."""

    def run():
        queries, keys = SELF_CHECK.scoring_case(like, group)
        scale = queries.shape[-1] ** -0.5
        got = attention_scores_kernel(queries, keys, scale)
        return SELF_CHECK.tensor_comparisons("probs", got, attention_scores_twin(queries, keys, scale))

    return SELF_CHECK.kernel_passes("speculative-prefill scoring", like, group, run)
