"""Phase 2 of H2O: one chunk's queries against the previous memory set, gathered per KV head.

No mask: every query of the chunk sees every memory slot of its KV head. Returns the
online-softmax state and, per memory slot, the column sum over the chunk's queries.
Triton kernel (kernels/flash_triton.py) and torch twin, chosen by `inter_attention`.
"""

from __future__ import annotations

import math

import torch

import specfill.backends.torch_cuda.kernels.dispatch as dispatch  # a module reference: tests patch its triton_kernel
from specfill.core.self_check_cases import CASE_SLOTS
from specfill.core.stages import InterResult, KeyWindow, active_terms, sinks_of, softcap_of

from .cpu_flash import cpu_flash_runs, inter_attention_flash
from .cpu_units import run_units
from .dispatch import SELF_CHECK, choose_kernel, kernel_runs
from .intra import check_attention_shapes, row_sinks2
from .state import LOG2E, empty_state, soft_cap2_, softmax_state_, stacked_buffers, stats_dtype, unstacked_state

# query rows per block of the twin (times G stacked heads) against all M memory slots:
# 64 to 256 measured within ~10% at S = 1024, M = 512 on CPU, whole chunks at once ~50% slower
_TWIN_QUERY_BLOCK = 128


def key_window_distance(window: KeyWindow, lo: int, hi: int, n_slots: int, device: torch.device) -> torch.Tensor:
    """[Hkv or 1, hi - lo, M]: position of query rows [lo, hi) minus each key slot's position."""
    keys = (
        torch.arange(window.key_start, window.key_start + n_slots, device=device)[None]
        if window.key_positions is None
        else window.key_positions.to(device=device, dtype=torch.int64)
    )
    return (window.query_start + torch.arange(lo, hi, device=device))[None, :, None] - keys[:, None, :]


def inter_attention_twin(q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True) -> InterResult:
    """Torch-ops twin (the dispatcher's arguments but use_kernel; M >= 1): the G query heads of a KV
    head are the rows of one matmul, in blocks of query rows so that a block's logits stay near
    cache size; each (block, KV head) is an independent work unit (cpu_units.run_units), so that the
    dense tail's few rows (one block) still spread over the threads. The soft-cap caps the logits
    before the window's mask; sinks join the column sums' denominators only."""
    n_heads, n_tokens, head_dim = q.shape
    n_kv, n_mem, value_dim = k_mem.shape[0], k_mem.shape[1], v_mem.shape[2]
    group = n_heads // n_kv
    stats = stats_dtype(q, k_mem, v_mem)
    rows = (q.to(stats) * (scale * LOG2E)).reshape(n_kv, group, n_tokens, head_dim)
    keys_t, values = k_mem.to(stats).transpose(1, 2), v_mem.to(stats)
    m, l, o = stacked_buffers(q, n_kv, value_dim, stats)
    n_blocks = -(-n_tokens // _TWIN_QUERY_BLOCK)
    # one partial column sum per block, added up in block order once all have run
    partial = torch.empty((n_blocks, n_kv, group, n_mem), dtype=stats, device=q.device) if with_colsum else None
    sinks, softcap = sinks_of(terms), softcap_of(terms)

    def one_unit(index: int) -> None:  # writes only its block's rows and partial sums of its KV head
        block, head = divmod(index, n_kv)
        lo = block * _TWIN_QUERY_BLOCK
        hi = min(lo + _TWIN_QUERY_BLOCK, n_tokens)
        logits = soft_cap2_(rows[head, :, lo:hi].reshape(group * (hi - lo), head_dim) @ keys_t[head], softcap)
        if window is not None:
            distance = key_window_distance(window, lo, hi, n_mem, q.device)  # [Hkv or 1, rows, M]
            distance = distance[head if distance.shape[0] > 1 else 0]
            logits.view(group, hi - lo, n_mem).masked_fill_((distance < 0) | (distance >= window.size), -math.inf)
        sinks2 = None if sinks is None else row_sinks2(terms, n_kv, group, hi - lo, stats, q.device)[head]
        state, weights = softmax_state_(logits, values[head], sinks2)
        m[head, :, lo:hi] = state.m.view(group, hi - lo)
        l[head, :, lo:hi] = state.l.view(group, hi - lo)
        o[head, :, lo:hi] = state.o.view(group, hi - lo, value_dim)
        if partial is not None:
            torch.sum(weights.view(group, hi - lo, n_mem), dim=1, out=partial[block, head])

    run_units(one_unit, n_blocks * n_kv, q.device)
    colsum = None if partial is None else partial.sum(dim=0)
    return InterResult(unstacked_state(m, l, o, q.dtype), None if colsum is None else colsum.view(n_heads, n_mem))


def inter_attention(
    q, k_mem, v_mem, scale, use_kernel: bool | None = None, window=None, terms=None, with_colsum: bool = True
) -> InterResult:
    """The stage H2OStageOps.inter_attention (core/stages.py) on torch tensors, dtypes and
    use_kernel / with_colsum as intra_attention's; an empty memory (M = 0) gives the empty state
    (m = -inf, l = 0, o = 0) and no column sums. A window, attention terms and narrower values
    (latent attention's, said once) run the twin; CPU tensors the CPU flash path where it applies
    (kernels/cpu_flash.py).
    """
    check_attention_shapes(q, k_mem, v_mem)
    kernel = choose_kernel(use_kernel, q, k_mem, v_mem, self_check=lambda: _self_check(q, q.shape[0] // k_mem.shape[0]))
    if k_mem.shape[1] == 0:
        stats = stats_dtype(q, k_mem, v_mem)
        state = empty_state(q.shape[0], q.shape[1], v_mem.shape[2], q.dtype, q.device, stats)
        colsum = torch.zeros((q.shape[0], 0), dtype=stats, device=q.device) if with_colsum else None
        return InterResult(state, colsum)
    terms = active_terms(terms)
    if kernel_runs("phase-2 inter attention", kernel, terms, window is not None, v_mem.shape[2] != k_mem.shape[2]):
        result = dispatch.triton_kernel("flash_attention")(q, k_mem, v_mem, scale, None, with_colsum)
        return InterResult(result.state, result.colsum)
    if cpu_flash_runs(use_kernel, q, k_mem, v_mem, terms, window):
        return inter_attention_flash(q, k_mem, v_mem, scale, with_colsum, terms)
    return inter_attention_twin(q, k_mem, v_mem, scale, window, terms, with_colsum)


def _self_check(like: torch.Tensor, group: int) -> bool:
    """The phase-2 kernel against its twin on the small fixed case (core/self_check_cases.py)."""

    def run():
        q, k_mem, v_mem = SELF_CHECK.attention_case(like, group, CASE_SLOTS)
        scale = q.shape[-1] ** -0.5
        got = dispatch.triton_kernel("flash_attention")(q, k_mem, v_mem, scale, None, True)
        return SELF_CHECK.result_comparisons(got, inter_attention_twin(q, k_mem, v_mem, scale))

    return SELF_CHECK.kernel_passes("phase-2 inter attention", like, group, run)
