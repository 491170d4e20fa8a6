"""Phase 1 of H2O: block-diagonal causal attention of every chunk at once.

Query i (chunk c = i // S) sees keys j with j // S == c and j <= i. Returns the online-softmax
state per query and query head plus, per key j, the column sum over the queries of j's chunk
of the intra-only softmax, and the GQA reduction of those sums to KV heads.
Triton kernel (kernels/flash_triton.py) and torch twin, chosen by `intra_attention`.
"""

from __future__ import annotations

import math

import torch

import specfill.backends.torch_cuda.kernels.dispatch as dispatch  # a module reference: tests patch its triton_kernel
from specfill.core.self_check_cases import CASE_CHUNK, CASE_TOKENS
from specfill.core.stages import AttentionTerms, IntraResult, active_terms, sinks_of, softcap_of

from .cpu_flash import cpu_flash_runs, intra_attention_flash
from .cpu_units import run_units
from .dispatch import SELF_CHECK, choose_kernel, kernel_runs
from .state import LOG2E, empty_state, soft_cap2_, softmax_state_, stacked_buffers, stats_dtype, unstacked_state

# query rows per block of the twin: with G heads stacked, a block's logits (G * 64 rows by at most
# S keys) stay near cache size and the diagonal blocks waste little; 64 measured fastest on an
# AVX-512 CPU at S = 1024 (32 to 128 within ~10%, 256 +20%)
_TWIN_QUERY_BLOCK = 64


def check_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q [Hq, T, D], k [Hkv, K, D], v [Hkv, K, Dv] with Hq a multiple of Hkv (Dv: the values' own
    head dim, latent attention's narrower than D)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"attention takes q [Hq, T, D] and k/v [Hkv, K, D], got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]:
        raise ValueError(f"k/v shapes {tuple(k.shape)}, {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if k.shape[0] == 0 or q.shape[0] % k.shape[0] != 0:
        raise ValueError(f"{q.shape[0]} query heads are not a multiple of {k.shape[0]} KV heads")


def reduce_colsum_to_kv_heads(colsum: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[Hq, X] -> [Hkv, X]: sum over the G query heads that share each KV head."""
    n_heads = colsum.shape[0]
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    return colsum.reshape(n_kv_heads, n_heads // n_kv_heads, *colsum.shape[1:]).sum(dim=1)


def row_sinks2(
    terms: AttentionTerms | None, n_kv: int, group: int, n_rows: int, stats: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """The terms' sinks [Hq] in base-2 units as [Hkv, G * n_rows, 1]: row g * n_rows + r of KV head
    kv (the twins' stacked rows) takes query head kv * G + g's sink. None without sinks."""
    sinks = sinks_of(terms)
    if sinks is None:
        return None
    sinks2 = sinks.to(device=device, dtype=stats).reshape(n_kv, group, 1) * LOG2E
    return sinks2.expand(n_kv, group, n_rows).reshape(n_kv, group * n_rows, 1)


def intra_attention_twin(q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True) -> IntraResult:
    """Torch-ops twin of the phase-1 kernel (the dispatcher's arguments but use_kernel): explicit
    logits per block of query rows, fp32 statistics.

    A query block [lo, hi) of a chunk only meets the chunk's keys before hi, so nothing above the
    diagonal is computed; with a sliding window w (query i sees keys j > i - w) nothing before
    lo - w + 1 either, and the rest is masked. The G query heads of a KV head are stacked as rows of one matmul, so
    K/V are never repeated. Chunks are independent work units (cpu_units.run_units). terms: the
    soft-cap caps the logits before the masks; sinks join the column sums' denominators only.
    """
    n_heads, n_tokens, head_dim = q.shape
    n_kv, value_dim = k.shape[0], v.shape[2]
    group = n_heads // n_kv
    stats = stats_dtype(q, k, v)
    # [Hkv, G, T, D]: query heads kv*G .. kv*G + G - 1 share KV head kv (q pre-scaled, base 2)
    rows = (q.to(stats) * (scale * LOG2E)).reshape(n_kv, group, n_tokens, head_dim)
    k, v = k.to(stats), v.to(stats)
    m, l, o = stacked_buffers(q, n_kv, value_dim, stats)
    colsum = torch.zeros_like(m) if with_colsum else None
    block = _TWIN_QUERY_BLOCK
    sinks, softcap = sinks_of(terms), softcap_of(terms)
    after_query = torch.ones((block, block), dtype=torch.bool, device=q.device).triu_(1)

    def one_chunk(chunk: int) -> None:  # writes only the chunk's own rows and keys
        chunk_start = chunk * chunk_size
        chunk_end = min(chunk_start + chunk_size, n_tokens)
        for lo in range(chunk_start, chunk_end, block):
            hi = min(lo + block, chunk_end)
            first = chunk_start if window is None else max(chunk_start, lo - window + 1)
            n_rows, n_keys = hi - lo, hi - first
            block_rows = rows[:, :, lo:hi].reshape(n_kv, group * n_rows, head_dim)
            logits = soft_cap2_(block_rows @ k[:, first:hi].transpose(1, 2), softcap)
            # only the block's own keys can come after a query
            logits.view(n_kv, group, n_rows, n_keys)[..., lo - first :].masked_fill_(
                after_query[:n_rows, :n_rows], -math.inf
            )
            if window is not None:  # keys at or before i - w fall out of query i's window
                distance = torch.arange(lo, hi, device=q.device)[:, None] - torch.arange(first, hi, device=q.device)
                logits.view(n_kv, group, n_rows, n_keys).masked_fill_(distance >= window, -math.inf)
            sinks2 = None if sinks is None else row_sinks2(terms, n_kv, group, n_rows, stats, q.device)
            state, weights = softmax_state_(logits, v[:, first:hi], sinks2)
            m[:, :, lo:hi] = state.m.view(n_kv, group, n_rows)
            l[:, :, lo:hi] = state.l.view(n_kv, group, n_rows)
            o[:, :, lo:hi] = state.o.view(n_kv, group, n_rows, value_dim)
            if colsum is not None:
                colsum[:, :, first:hi] += weights.view(n_kv, group, n_rows, n_keys).sum(dim=2)

    run_units(one_chunk, math.ceil(n_tokens / chunk_size), q.device)
    return IntraResult(unstacked_state(m, l, o, q.dtype), None if colsum is None else colsum.view(n_heads, n_tokens))


def intra_attention(
    q, k, v, chunk_size, scale, use_kernel: bool | None = None, window=None, terms=None, with_colsum: bool = True
) -> IntraResult:
    """The stage H2OStageOps.intra_attention (core/stages.py) on torch tensors: m, l fp32 (fp64 for
    fp64 inputs), o in q's dtype; with_colsum False: no column sums (None). use_kernel: None =
    Triton on CUDA, else the CPU flash path where it applies (kernels/cpu_flash.py: bf16 / fp16 CPU
    tensors), else the twin; True / False force Triton / the twin. The Triton kernel takes no window,
    no attention terms (said once: note_term_fallback) and no narrower values: those run the twin,
    kernels forced included.
    """
    check_attention_shapes(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"intra attention needs one key per query, got {q.shape[1]} queries, {k.shape[1]} keys")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    kernel = choose_kernel(use_kernel, q, k, v, self_check=lambda: _self_check(q, q.shape[0] // k.shape[0]))
    if q.shape[1] == 0:
        stats = stats_dtype(q, k, v)
        state = empty_state(q.shape[0], 0, v.shape[2], q.dtype, q.device, stats)
        return IntraResult(state, state.l.clone() if with_colsum else None)
    terms = active_terms(terms)
    if kernel_runs("phase-1 intra attention", kernel, terms, window is not None, v.shape[2] != k.shape[2]):
        return dispatch.triton_kernel("flash_attention")(q, k, v, scale, chunk_size, with_colsum)
    if cpu_flash_runs(use_kernel, q, k, v, terms, window):
        return intra_attention_flash(q, k, v, chunk_size, scale, with_colsum, terms)
    return intra_attention_twin(q, k, v, chunk_size, scale, window, terms, with_colsum)


def _self_check(like: torch.Tensor, group: int) -> bool:
    """The phase-1 kernel against its twin on the small fixed case (core/self_check_cases.py)."""

    def run():
        q, k, v = SELF_CHECK.attention_case(like, group, CASE_TOKENS)
        scale = q.shape[-1] ** -0.5
        got = dispatch.triton_kernel("flash_attention")(q, k, v, scale, CASE_CHUNK, True)
        return SELF_CHECK.result_comparisons(got, intra_attention_twin(q, k, v, CASE_CHUNK, scale))

    return SELF_CHECK.kernel_passes("phase-1 intra attention", like, group, run)
