"""Phase 1 of H2O: block-diagonal causal attention of every chunk at once.

For query i the keys are [chunk_start(i), i] with chunk_start(i) = (i // S) * S (chunks start
at token 0 of the block). Returns the online-softmax state (m, l float32; o normalised, in the
input dtype) and, per key, the column sum of the intra-only softmax over its chunk's queries.
"""

from __future__ import annotations

import math

import mlx.core as mx

from specfill.core.errors import ConfigError
from specfill.core.self_check_cases import CASE_CHUNK, CASE_TOKENS
from specfill.core.stages import AttentionState, IntraResult, active_terms, sinks_of, softcap_of

from .dispatch import SELF_CHECK, choose_kernel, common_dtype, kernel_runs, metal_kernels
from .online_softmax import ATTENTION_SOURCE, COLSUM_SOURCE, phase_specs, run_kernels
from .state import sink_weights, soft_cap

# Query i sees keys [chunk_start(i), i]: itself included, so at least one key.
INTRA_ATTENTION_SOURCE = ATTENTION_SOURCE.substitute(
    keys="""    const int start = (i / chunk_size) * chunk_size;
    auto k_head = k + size_t(g) * n_tokens * D;
    auto v_head = v + size_t(g) * n_tokens * D;""",
    last="i",
)

# Key j is seen by the queries [j, chunk_end(j)) of its chunk.
INTRA_COLSUM_SOURCE = COLSUM_SOURCE.substitute(
    n_keys="n_tokens",
    queries="""    const int first = j;
    const int stop = metal::min((j / chunk_size + 1) * chunk_size, int(n_tokens));
    auto k_row = k + (size_t(g) * n_tokens + j) * D;""",
)

INTRA_ATTENTION_SPEC, INTRA_COLSUM_SPEC = phase_specs(
    "intra", "k", "v", "chunk_size", INTRA_ATTENTION_SOURCE, INTRA_COLSUM_SOURCE
)


_make_intra_kernel = metal_kernels(INTRA_ATTENTION_SPEC, INTRA_COLSUM_SPEC)  # (attention, column sums)


def _check(q: mx.array, k: mx.array, v: mx.array, chunk_size: int) -> None:
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"intra attention takes q [Hq, T, D], k [Hkv, T, D], v [Hkv, T, Dv]; got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0] != 0:
        raise ValueError(f"q {q.shape} does not match k/v {k.shape} (same T and D, Hq a multiple of Hkv)")
    common_dtype(q, k, v)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def intra_attention_kernel(q: mx.array, k: mx.array, v: mx.array, chunk_size: int, scale: float) -> IntraResult:
    """The Metal path (needs Metal)."""
    return IntraResult(*run_kernels(_make_intra_kernel(), q, k, v, chunk_size, scale))


def intra_attention_twin(q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True) -> IntraResult:
    """The MLX-ops twin (the stage's arguments): every chunk padded to S and attended as one [S, S]
    block, float32, GQA by broadcasting; the soft-cap before the mask, the sinks in the column sums only."""
    n_heads, n_tokens, head_dim = q.shape
    n_kv = k.shape[0]
    group = n_heads // n_kv
    chunk_size = min(chunk_size, n_tokens)  # one chunk either way; no padding to a large S
    n_chunks = math.ceil(n_tokens / chunk_size)
    padded = n_chunks * chunk_size

    def blocks(x: mx.array) -> mx.array:  # [H, T, D or Dv] -> [H, C, S, D or Dv] float32, zero padded
        x = mx.pad(x.astype(mx.float32), [(0, 0), (0, padded - n_tokens), (0, 0)])
        return x.reshape(x.shape[0], n_chunks, chunk_size, x.shape[-1])

    qb = blocks(q).reshape(n_kv, group, n_chunks, chunk_size, head_dim)
    kb, vb = blocks(k)[:, None], blocks(v)[:, None]  # [Hkv, 1, C, S, D]: GQA by broadcasting
    logits = soft_cap((qb @ kb.swapaxes(-1, -2)) * scale, softcap_of(terms))  # [Hkv, G, C, S(query), S(key)]
    local = mx.arange(chunk_size)
    real = (mx.arange(n_chunks)[:, None] * chunk_size + local[None, :]) < n_tokens  # [C, S]
    distance = local[:, None] - local[None, :]  # [S(query), S(key)]
    causal = (distance >= 0) if window is None else (distance >= 0) & (distance < window)
    valid = causal[None] & real[:, None, :]  # [C, S, S]
    logits = mx.where(valid, logits, -mx.inf)
    m = logits.max(axis=-1)  # finite for real rows; a padded row may see nothing under a window
    p = mx.exp(logits - mx.where(mx.isinf(m), 0.0, m)[..., None])
    l = p.sum(axis=-1)
    weights = p / mx.where(l > 0, l, 1.0)[..., None]
    o = weights @ vb

    def flat(x: mx.array) -> mx.array:  # [Hkv, G, C, S, ...] -> [Hq, T, ...]
        return x.reshape(n_heads, padded, *x.shape[4:])[:, :n_tokens]

    state = AttentionState(flat(m), flat(l), flat(o).astype(q.dtype))
    if not with_colsum:
        return IntraResult(state, None)
    if sinks_of(terms) is not None:  # the column sums' softmax takes the sink (o above does not)
        weights = sink_weights(logits, m, sinks_of(terms).reshape(n_kv, group, 1, 1))
    # column sums count real queries only (padded query rows see real keys)
    return IntraResult(state, flat((weights * real[:, :, None]).sum(axis=-2)))


def intra_attention(
    q, k, v, chunk_size, scale, use_kernel: bool | None = None, window=None, terms=None, with_colsum=True
) -> IntraResult:
    """The stage H2OStageOps.intra_attention (core/stages.py) on MLX arrays: m, l float32, o in q's
    dtype. use_kernel: the Metal kernel where Metal exists (None), forced (True:
    BackendUnavailableError without Metal) or the twin (False). The Metal kernel takes no window, no
    attention terms (said once: note_term_fallback) and no narrower values: those run the twin,
    kernels forced included. with_colsum False: colsum None (the Metal kernel makes them, dropped)."""
    _check(q, k, v, chunk_size)
    use = choose_kernel(
        use_kernel, "phase-1 intra attention", self_check=lambda: _self_check(q, q.shape[0] // k.shape[0])
    )
    if q.shape[1] == 0:
        zeros = mx.zeros((q.shape[0], 0), dtype=mx.float32)
        state = AttentionState(zeros, zeros, mx.zeros((q.shape[0], 0, v.shape[2]), dtype=q.dtype))
        return IntraResult(state, zeros if with_colsum else None)
    terms = active_terms(terms)
    if kernel_runs("phase-1 intra attention", use, terms, window is not None, v.shape[2] != k.shape[2]):
        result = intra_attention_kernel(q, k, v, chunk_size, scale)
        return result if with_colsum else IntraResult(result.state, None)
    return intra_attention_twin(q, k, v, chunk_size, scale, window, terms, with_colsum)


def _self_check(like: mx.array, group: int) -> bool:
    """The phase-1 kernel against its twin on the small fixed case (core/self_check_cases.py)."""

    def run():
        q, k, v = SELF_CHECK.attention_case(like, group, CASE_TOKENS)
        scale = q.shape[-1] ** -0.5
        got = intra_attention_kernel(q, k, v, CASE_CHUNK, scale)
        return SELF_CHECK.result_comparisons(got, intra_attention_twin(q, k, v, CASE_CHUNK, scale))

    return SELF_CHECK.kernel_passes("phase-1 intra attention", like, group, run)


def reduce_colsum_to_kv_heads(colsum: mx.array, n_kv_heads: int) -> mx.array:
    """[Hq, X] -> [Hkv, X]: sum of the G query heads that share each KV head (h // G)."""
    n_heads = colsum.shape[0]
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    return colsum.reshape(n_kv_heads, n_heads // n_kv_heads, *colsum.shape[1:]).sum(axis=1)
