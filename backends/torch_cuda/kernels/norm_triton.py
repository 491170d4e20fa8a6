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
tests/torch_cuda_kernels/fused_cases.py hold it to.

Imported lazily (backends/torch_cuda/model.py through kernels/dispatch.py): Triton decides at
decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..fused import norm_launchable
from .dispatch import next_power_of_2


def row_launch(width: int) -> tuple[int, int]:
    """(BLOCK, warps) of a row's program for rows of `width` (rms_norm, and kernels/aot.py): the row in
    one power-of-2 block, 8 warps for rows of 4,096 and wider (16+ elements a thread), 4 below."""
    block = next_power_of_2(width)
    return block, (8 if block >= 4096 else 4)


@triton.jit
def _rms_norm_kernel(
    X,
    R,
    W,
    O,
    stride_xt,
    stride_xh,
    stride_rt,
    stride_rh,
    stride_ot,
    stride_oh,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t, head = tl.program_id(0), tl.program_id(1)  # a row: token t's head (one row a token for [1, T, n])
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x_row = X + t * stride_xt + head * stride_xh + cols
    x = tl.load(x_row, mask=inside, other=0.0)
    kind = x.dtype
    if HAS_RESIDUAL:  # h = out + x, rounded to the activation dtype as torch's add_, written over out
        r = tl.load(R + t * stride_rt + head * stride_rh + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(kind)
        tl.store(x_row, x, mask=inside)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(kind).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(O + t * stride_ot + head * stride_oh + cols, (w * normed).to(kind), mask=inside)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, weight * rms_norm(h)) for x [1, T, n] or per head [1, T, H, n] (rows with a unit last stride;
    Qwen3's q / k norms take the heads of the fused projection in place), weight [n] of x's dtype: h is
    x, or with `residual` (x's shape, [1, T, n] only) x + residual written into x in place, as the
    block's `out.add_(x)`. The normalised rows are a new contiguous tensor of x's shape."""
    if not norm_launchable(x, weight) or (residual is not None and not norm_launchable(residual, weight)):
        raise ValueError(
            f"rms_norm kernel: x [1, T, n] or [1, T, H, n] with a unit last stride and weight [n] of its dtype; "
            f"got {tuple(x.shape)} {x.dtype} (strides {x.stride()}), weight {tuple(weight.shape)} {weight.dtype}"
            + ("" if residual is None else f", residual {tuple(residual.shape)} (strides {residual.stride()})")
        )
    if residual is not None and (residual.shape != x.shape or x.dim() != 3):
        raise ValueError(f"rms_norm kernel: residual {tuple(residual.shape)} must be x's [1, T, n], {tuple(x.shape)}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return x, out
    n_tokens, n_cols = x.shape[1], x.shape[-1]
    heads = 1 if x.dim() == 3 else x.shape[2]

    def strides(t: torch.Tensor) -> tuple[int, int]:
        return t.stride(1), (0 if t.dim() == 3 else t.stride(2))

    block, warps = row_launch(n_cols)
    r = x if residual is None else residual
    _rms_norm_kernel[(n_tokens, heads)](
        x, r, weight, out, *strides(x), *strides(r), *strides(out), n_cols, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return x, out
