"""The Metal source both H2O phases run: phase 1 (intra.py) and phase 2 (inter.py) differ only in
which keys a query sees and which queries a key is seen by, so each fills in those lines and
shares the rest. Template fields (string.Template, so the C braces stay as written):

- attention `$keys`: defines k_head, v_head (the query's KV head) and start, and `$last`: query i
  sees the key rows [start, last] (at least one: start <= last);
- column sums: `$n_keys` (the key count, the grid's x extent) and `$queries`: defines k_row (key j's
  row) and the query rows [first, stop) that see key j.

`phase_specs` names a phase's pair of kernels built from them, `run_kernels` launches them.
"""

from __future__ import annotations

from string import Template

import mlx.core as mx

from .state import AttentionState

THREADS_PER_GROUP = 64  # small on purpose: well under any pipeline limit, even with D=256

# One thread per (query i, query head h): online softmax over key rows [start, last]. The running
# state starts from a real key (start), so it never holds -inf.
ATTENTION_SOURCE = Template("""
    const int i = int(thread_position_in_grid.x);
    const int h = int(thread_position_in_grid.y);
    if (i >= n_tokens) {
        return;
    }
    const int g = h / G;
    auto q_row = q + (size_t(h) * n_tokens + i) * D;
$keys
    float q_reg[D];
    for (int d = 0; d < D; ++d) {
        q_reg[d] = static_cast<float>(q_row[d]);
    }
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) {
        dot += q_reg[d] * static_cast<float>(k_head[size_t(start) * D + d]);
    }
    float m_run = dot * scale;
    float l_run = 1.0f;
    float acc[D];
    for (int d = 0; d < D; ++d) {
        acc[d] = static_cast<float>(v_head[size_t(start) * D + d]);
    }
    for (int j = start + 1; j <= $last; ++j) {
        auto k_row = k_head + size_t(j) * D;
        auto v_row = v_head + size_t(j) * D;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) {
            s += q_reg[d] * static_cast<float>(k_row[d]);
        }
        s *= scale;
        if (s > m_run) {
            const float correction = metal::exp(m_run - s);
            l_run = l_run * correction + 1.0f;
            for (int d = 0; d < D; ++d) {
                acc[d] = acc[d] * correction + static_cast<float>(v_row[d]);
            }
            m_run = s;
        } else {
            const float p = metal::exp(s - m_run);
            l_run += p;
            for (int d = 0; d < D; ++d) {
                acc[d] += p * static_cast<float>(v_row[d]);
            }
        }
    }
    const size_t row = size_t(h) * n_tokens + i;
    m_out[row] = m_run;
    l_out[row] = l_run;
    for (int d = 0; d < D; ++d) {
        o_out[row * D + d] = static_cast<InT>(acc[d] / l_run);
    }
""")

# One thread per (key j, query head h): the sum over query rows [first, stop) of
# softmax(i, j) = exp(s_ij - m_i) / l_i, the logits computed as in the attention kernel.
COLSUM_SOURCE = Template("""
    const int j = int(thread_position_in_grid.x);
    const int h = int(thread_position_in_grid.y);
    if (j >= $n_keys) {
        return;
    }
    const int g = h / G;
$queries
    float k_reg[D];
    for (int d = 0; d < D; ++d) {
        k_reg[d] = static_cast<float>(k_row[d]);
    }
    float total = 0.0f;
    for (int i = first; i < stop; ++i) {
        const size_t row = size_t(h) * n_tokens + i;
        auto q_row = q + row * D;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) {
            s += static_cast<float>(q_row[d]) * k_reg[d];
        }
        s *= scale;
        total += metal::exp(s - m_in[row]) / l_in[row];
    }
    colsum[size_t(h) * $n_keys + j] = total;
""")


def phase_specs(phase: str, k: str, v: str, extent: str, attention: str, colsum: str) -> tuple[dict, dict]:
    """The mx.fast.metal_kernel arguments of a phase's (attention, column-sum) kernels: k, v, extent
    name its key, value and own size inputs (run_kernels passes them in this order)."""
    return (
        dict(
            name=f"specfill_{phase}_attention",
            input_names=["q", k, v, "n_tokens", extent, "scale"],
            output_names=["m_out", "l_out", "o_out"],
            source=attention,
        ),
        dict(
            name=f"specfill_{phase}_colsum",
            input_names=["q", k, "m_in", "l_in", "n_tokens", extent, "scale"],
            output_names=["colsum"],
            source=colsum,
        ),
    )


def run_kernels(
    kernels: tuple[object, object], q: mx.array, k: mx.array, v: mx.array, extent: int, scale: float
) -> tuple[AttentionState, mx.array]:
    """A phase's (attention, column-sum) kernels on q [Hq, T, D] and its keys k, v [Hkv, K, D]: the
    state over each query's keys and the column sums [Hq, K]. extent: the phase's own size input
    (the chunk size; the slot count)."""
    attention, colsum_kernel = kernels
    dtype = q.dtype
    n_heads, n_tokens, head_dim = q.shape
    n_keys = k.shape[1]
    template = [("InT", dtype), ("D", head_dim), ("G", n_heads // k.shape[0])]
    m, l, o = attention(
        inputs=[q, k, v, n_tokens, extent, float(scale)],
        template=template,
        grid=(n_tokens, n_heads, 1),
        threadgroup=(min(THREADS_PER_GROUP, n_tokens), 1, 1),
        output_shapes=[(n_heads, n_tokens), (n_heads, n_tokens), q.shape],
        output_dtypes=[mx.float32, mx.float32, dtype],
    )
    (colsum,) = colsum_kernel(
        inputs=[q, k, m, l, n_tokens, extent, float(scale)],
        template=template,
        grid=(n_keys, n_heads, 1),
        threadgroup=(min(THREADS_PER_GROUP, n_keys), 1, 1),
        output_shapes=[(n_heads, n_keys)],
        output_dtypes=[mx.float32],
    )
    return AttentionState(m, l, o), colsum
