"""Triton log-sum-exp merge of two attention halves: attention_choice's split candidates in one pass.

The "prefix" kind of prefill attention can run as two fused calls, unmasked over the cached prefix
and causal over the step's own keys, each returning its output and its rows' log-sum-exp; the two
are merged as out = (o_p e^(l_p - m) + o_c e^(l_c - m)) / (e^(l_p - m) + e^(l_c - m)), m = max(l_p,
l_c). In torch that is ~7 element-wise kernels in float32 over [1, H, T, D] (a 16K step of an 8B:
~3 GB moved a layer, ~0.6 ms on an H200, ~15% of the split candidate's time at the probe's shape);
here one program merges a block of one head's rows, reading both halves once and writing the
result once, in the [1, T, H, D] layout the output projection reads as a view (as
kernels/prefill_triton.py's output).

Float32 weights (the softmax statistics stay float32), one rounding to the activation dtype: within
float32 rounding of the torch formula (attention_choice._split), a row no key reaches (both
log-sum-exps -inf) comes out 0, not NaN.

Imported lazily (attention_choice.py through kernels/dispatch.py): Triton decides at decoration
time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import KERNEL_DTYPES, next_power_of_2

BLOCK_ELEMENTS = 2048  # of each half a program: 16 a thread with 4 warps (64-bit addresses: more spill)
LAUNCH_OPTIONS = {"num_warps": 4}


def block_rows(head_dim: int) -> int:
    """Rows a program merges for heads of `head_dim` (lse_merge, and kernels/aot.py): BLOCK_ELEMENTS of
    each half, 16 rows of 128-wide heads."""
    return max(1, BLOCK_ELEMENTS // next_power_of_2(head_dim))


@triton.jit
def _lse_merge_kernel(
    OP,
    OC,
    LP,
    LC,
    O,
    stride_oph,
    stride_opt,
    stride_och,
    stride_oct,
    stride_lph,
    stride_lpt,
    stride_lch,
    stride_lct,
    stride_oh,
    stride_ot,
    n_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    inside = rows < n_rows
    mask = inside[:, None] & (cols < HEAD_DIM)[None, :]
    lp = tl.load(LP + head * stride_lph + rows * stride_lpt, mask=inside, other=float("-inf")).to(tl.float32)
    lc = tl.load(LC + head * stride_lch + rows * stride_lct, mask=inside, other=float("-inf")).to(tl.float32)
    m = tl.maximum(lp, lc)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row no key reaches: both weights 0
    wp, wc = tl.exp(lp - m), tl.exp(lc - m)
    total = wp + wc
    total = tl.where(total > 0, total, 1.0)  # no division by 0 where both weights are 0
    wp, wc = wp / total, wc / total
    rows64 = rows.to(tl.int64)[:, None]
    op = tl.load(OP + head * stride_oph + rows64 * stride_opt + cols[None, :], mask=mask, other=0.0)
    oc = tl.load(OC + head * stride_och + rows64 * stride_oct + cols[None, :], mask=mask, other=0.0)
    out = op.to(tl.float32) * wp[:, None] + oc.to(tl.float32) * wc[:, None]
    tl.store(O + head * stride_oh + rows64 * stride_ot + cols[None, :], out.to(op.dtype), mask=mask)


def merge_launchable(out_p: torch.Tensor, out_c: torch.Tensor, lse_p: torch.Tensor, lse_c: torch.Tensor) -> bool:
    """The merge takes two halves [1, H, T, D] of one kernel dtype with a unit last stride, and their
    log-sum-exps [1, H, T] (any strides, float32 or the halves' dtype)."""
    halves = out_p.dim() == 4 and out_p.shape[0] == 1 and out_p.shape == out_c.shape and out_p.dtype == out_c.dtype
    if not halves or out_p.dtype not in KERNEL_DTYPES or out_p.stride(-1) != 1 or out_c.stride(-1) != 1:
        return False
    return all(tuple(x.shape) == tuple(out_p.shape[:3]) and x.is_floating_point() for x in (lse_p, lse_c))


def lse_merge(out_p: torch.Tensor, out_c: torch.Tensor, lse_p: torch.Tensor, lse_c: torch.Tensor) -> torch.Tensor:
    """The halves merged by their log-sum-exps: [1, H, T, D] in their dtype, a transposed view of a new
    contiguous [1, T, H, D]."""
    if not merge_launchable(out_p, out_c, lse_p, lse_c):
        raise ValueError(
            f"lse_merge kernel: halves [1, H, T, D] of one dtype with a unit last stride and log-sum-exps [1, H, T]; "
            f"got {tuple(out_p.shape)} {out_p.dtype} (strides {out_p.stride()}), {tuple(out_c.shape)} {out_c.dtype} "
            f"(strides {out_c.stride()}), {tuple(lse_p.shape)}, {tuple(lse_c.shape)}"
        )
    _, n_heads, n_rows, head_dim = out_p.shape
    out = torch.empty((1, n_rows, n_heads, head_dim), dtype=out_p.dtype, device=out_p.device).transpose(1, 2)
    if out.numel() == 0:
        return out
    rows = block_rows(head_dim)
    grid = (triton.cdiv(n_rows, rows), n_heads)
    _lse_merge_kernel[grid](
        out_p, out_c, lse_p, lse_c, out,
        out_p.stride(1), out_p.stride(2), out_c.stride(1), out_c.stride(2),
        lse_p.stride(1), lse_p.stride(2), lse_c.stride(1), lse_c.stride(2), out.stride(1), out.stride(2),
        n_rows, HEAD_DIM=head_dim, BLOCK_T=rows, BLOCK_D=next_power_of_2(head_dim), **LAUNCH_OPTIONS,
    )  # fmt: skip
    return out
