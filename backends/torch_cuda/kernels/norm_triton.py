"""Triton RMSNorm, with the residual add before it fused: model.RMSNorm's formula in one launch.

`weight * F.rms_norm(x)` is two kernels, and a block's `h = out + x` before its second norm a third;
a decode step of an 8B launches them in every layer (results/gpu/h200: a replayed decode step is
launch-bound, ~2.9 us a kernel). Here one program normalises one row: it reads the row (and the
residual), writes the sum where one is given, and writes `weight * normalised`.

Rounded where the formula rounds: the sum to the activation dtype, the normalised row computed in
float32 and rounded to it, then the weight's product rounded again (Hugging Face's order, as
model.RMSNorm). The mean of squares is a tree sum over the row, not torch's order, and rsqrt is the
GPU's: the result can differ from F.rms_norm's in the last place of a few elements (the sum itself
is bitwise), within the dtype's conformance tolerance, which the first-use self-check and
tests/torch_cuda_kernels/kernel_cases.py hold it to.

Imported lazily (backends/torch_cuda/model.py through kernels/dispatch.py): Triton decides at
decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..fused import norm_launchable
from .dispatch import next_power_of_2


def norm_warps(block: int) -> int:
    """Warps of a row's program: 8 for rows of 4,096 and wider (16+ elements a thread), 4 below."""
    return 8 if block >= 4096 else 4


@triton.jit
def _rms_norm_kernel(
    X,
    R,
    W,
    H,
    O,
    stride_x,
    stride_r,
    stride_h,
    stride_o,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=inside, other=0.0)
    kind = x.dtype
    if HAS_RESIDUAL:  # h = out + x, rounded to the activation dtype as torch's add_
        r = tl.load(R + row * stride_r + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(kind)
        tl.store(H + row * stride_h + cols, x, mask=inside)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(kind).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(O + row * stride_o + cols, (w * normed).to(kind), mask=inside)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, weight * rms_norm(h)) for x [1, T, n] (rows with a unit last stride), weight [n] of x's
    dtype: h is x, or with `residual` (x's shape) x + residual written into x in place, as the
    block's `out.add_(x)`. The normalised rows are a new contiguous [1, T, n]."""
    if not norm_launchable(x, weight) or (residual is not None and not norm_launchable(residual, weight)):
        raise ValueError(
            f"rms_norm kernel: x [1, T, n] with a unit last stride and weight [n] of its dtype; got {tuple(x.shape)} "
            f"{x.dtype} (strides {x.stride()}), weight {tuple(weight.shape)} {weight.dtype}"
            + ("" if residual is None else f", residual {tuple(residual.shape)} (strides {residual.stride()})")
        )
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm kernel: residual {tuple(residual.shape)} is not x's {tuple(x.shape)}")
    n_rows, n_cols = x.shape[1], x.shape[2]
    out = torch.empty((1, n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return x, out
    block = next_power_of_2(n_cols)
    r = x if residual is None else residual
    _rms_norm_kernel[(n_rows,)](
        x, r, weight, x, out, x.stride(1), r.stride(1), x.stride(1), out.stride(1), n_cols, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=norm_warps(block),
    )  # fmt: skip
    return x, out
