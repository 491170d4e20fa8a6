"""Phase 2 of H2O: one chunk's queries attend to the previous memory set, gathered per KV head
into k_mem/v_mem [Hkv, M, D], with no mask. Returns the state and per-slot column sums."""

from __future__ import annotations

import mlx.core as mx

from specfill.core.self_check_cases import CASE_SLOTS
from specfill.core.stages import AttentionState, InterResult, KeyWindow, active_terms, sinks_of, softcap_of

from .dispatch import SELF_CHECK, choose_kernel, common_dtype, kernel_runs, metal_kernels
from .online_softmax import ATTENTION_SOURCE, COLSUM_SOURCE, phase_specs, run_kernels
from .state import empty_state, sink_weights, soft_cap

# Query i sees every memory slot [0, M) (M >= 1: the dispatcher answers M = 0 itself).
INTER_ATTENTION_SOURCE = ATTENTION_SOURCE.substitute(
    keys="""    const int start = 0;
    auto k_head = k_mem + size_t(g) * n_slots * D;
    auto v_head = v_mem + size_t(g) * n_slots * D;""",
    last="n_slots - 1",
)

# Slot j is seen by every query of the chunk.
INTER_COLSUM_SOURCE = COLSUM_SOURCE.substitute(
    n_keys="n_slots",
    queries="""    const int first = 0;
    const int stop = n_tokens;
    auto k_row = k_mem + (size_t(g) * n_slots + j) * D;""",
)

INTER_ATTENTION_SPEC, INTER_COLSUM_SPEC = phase_specs(
    "inter", "k_mem", "v_mem", "n_slots", INTER_ATTENTION_SOURCE, INTER_COLSUM_SOURCE
)


_make_inter_kernel = metal_kernels(INTER_ATTENTION_SPEC, INTER_COLSUM_SPEC)  # (attention, column sums)


def _check(q: mx.array, k_mem: mx.array, v_mem: mx.array) -> None:
    if q.ndim != 3 or k_mem.ndim != 3 or v_mem.ndim != 3 or k_mem.shape[:2] != v_mem.shape[:2]:
        raise ValueError(
            f"inter attention takes q [Hq, T, D], k_mem [Hkv, M, D], v_mem [Hkv, M, Dv]; "
            f"got {q.shape}, {k_mem.shape}, {v_mem.shape}"
        )
    if q.shape[2] != k_mem.shape[2] or q.shape[0] % k_mem.shape[0] != 0:
        raise ValueError(f"q {q.shape} does not match k_mem {k_mem.shape} (same D, Hq a multiple of Hkv)")
    common_dtype(q, k_mem, v_mem)


def inter_attention_kernel(q: mx.array, k_mem: mx.array, v_mem: mx.array, scale: float) -> InterResult:
    """The Metal path (needs Metal and M >= 1)."""
    return InterResult(*run_kernels(_make_inter_kernel(), q, k_mem, v_mem, k_mem.shape[1], scale))


def key_window_visible(window: KeyWindow, n_tokens: int, n_slots: int) -> mx.array:
    """[Hkv or 1, T, M] bool: which key slot each query row sees under a sliding window."""
    keys = (
        mx.arange(window.key_start, window.key_start + n_slots)[None]
        if window.key_positions is None
        else window.key_positions.astype(mx.int32)
    )
    distance = (window.query_start + mx.arange(n_tokens))[None, :, None] - keys[:, None, :]
    return (distance >= 0) & (distance < window.size)


def inter_attention_twin(q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True) -> InterResult:
    """The MLX-ops twin (the stage's arguments, M >= 1), float32, GQA by broadcasting (no repeated
    K/V); the soft-cap before the window's mask, the sinks in the column sums only."""
    n_heads, n_tokens, head_dim = q.shape
    n_kv, n_slots = k_mem.shape[:2]
    qg = q.astype(mx.float32).reshape(n_kv, n_heads // n_kv, n_tokens, head_dim)
    logits = soft_cap(
        (qg @ k_mem.astype(mx.float32)[:, None].swapaxes(-1, -2)) * scale, softcap_of(terms)
    )  # [Hkv, G, T, M]
    if window is not None:
        logits = mx.where(key_window_visible(window, n_tokens, n_slots)[:, None], logits, -mx.inf)
    m = logits.max(axis=-1)
    p = mx.exp(logits - mx.where(mx.isinf(m), 0.0, m)[..., None])
    l = p.sum(axis=-1)
    weights = p / mx.where(l > 0, l, 1.0)[..., None]
    o = weights @ v_mem.astype(mx.float32)[:, None]
    state = AttentionState(
        m.reshape(n_heads, n_tokens),
        l.reshape(n_heads, n_tokens),
        o.reshape(n_heads, n_tokens, v_mem.shape[2]).astype(q.dtype),
    )
    if not with_colsum:
        return InterResult(state, None)
    if sinks_of(terms) is not None:  # the column sums' softmax takes the sink (o above does not)
        weights = sink_weights(logits, m, sinks_of(terms).reshape(n_kv, n_heads // n_kv, 1))
    return InterResult(state, weights.sum(axis=-2).reshape(n_heads, n_slots))


def inter_attention(
    q, k_mem, v_mem, scale, use_kernel: bool | None = None, window=None, terms=None, with_colsum=True
) -> InterResult:
    """The stage H2OStageOps.inter_attention (core/stages.py) on MLX arrays: m, l float32, o in q's
    dtype; M = 0 gives the empty state and no column sums, without NaN. use_kernel and with_colsum
    as intra_attention's; a window, attention terms and narrower values run the twin."""
    _check(q, k_mem, v_mem)
    use = choose_kernel(
        use_kernel, "phase-2 inter attention", self_check=lambda: _self_check(q, q.shape[0] // k_mem.shape[0])
    )
    n_heads, n_tokens, head_dim = q.shape
    if k_mem.shape[1] == 0 or n_tokens == 0:
        return InterResult(
            empty_state(n_heads, n_tokens, v_mem.shape[2], q.dtype),
            mx.zeros((n_heads, k_mem.shape[1]), dtype=mx.float32) if with_colsum else None,
        )
    terms = active_terms(terms)
    if kernel_runs("phase-2 inter attention", use, terms, window is not None, v_mem.shape[2] != k_mem.shape[2]):
        result = inter_attention_kernel(q, k_mem, v_mem, scale)
        return result if with_colsum else InterResult(result.state, None)
    return inter_attention_twin(q, k_mem, v_mem, scale, window, terms, with_colsum)


def _self_check(like: mx.array, group: int) -> bool:
    """The phase-2 kernel against its twin on the small fixed case (core/self_check_cases.py)."""

    def run():
        q, k_mem, v_mem = SELF_CHECK.attention_case(like, group, CASE_SLOTS)
        scale = q.shape[-1] ** -0.5
        got = inter_attention_kernel(q, k_mem, v_mem, scale)
        return SELF_CHECK.result_comparisons(got, inter_attention_twin(q, k_mem, v_mem, scale))

    return SELF_CHECK.kernel_passes("phase-2 inter attention", like, group, run)
