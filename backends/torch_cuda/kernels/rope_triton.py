"""Triton rotary position embedding: rope.apply_rope's formula in one launch.

`x * cos + rotate_half(x) * sin` is five element-wise kernels in torch (two products, a negation,
a concatenation, a sum), each a launch and a pass over the rotated heads. A decode step of an 8B
rotates q and k once per layer, so that is ~160 of a step's launches (results/gpu/h200: a decode
step replayed as a CUDA graph is launch-bound, ~2.9 us a kernel). Here one program rotates a block
of one token's heads, reading x, cos and sin once.

Bitwise torch's result: each product and the sum are computed in float32 and rounded to x's dtype
where torch rounds them (its half / bfloat16 element-wise ops compute in float32 and round every
op's result; the negation is exact), and float32 runs with FMA contraction off, so `a * b + c`
stays two roundings, as torch's two kernels make it. tests/torch_cuda_kernels/fused_cases.py
checks equality, not closeness.

Imported lazily (backends/torch_cuda/rope.py through kernels/dispatch.py): Triton decides at
decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..fused import rotary_launchable
from .dispatch import next_power_of_2

HEADS_PER_PROGRAM = 16  # an 8B's 32 + 8 rotated heads of a decode token: three programs


LAUNCH_OPTIONS = {"num_warps": 4, "enable_fp_fusion": False}  # no FMA contraction: torch's two roundings


def launch_constants(n_heads: int, head_dim: int) -> dict[str, int]:
    """The kernel's compile-time sizes for `n_heads` heads of `head_dim` (rotary, and kernels/aot.py)."""
    half = head_dim // 2
    return {
        "HALF": half,
        "BLOCK_H": min(HEADS_PER_PROGRAM, next_power_of_2(n_heads)),
        "BLOCK_D": next_power_of_2(half),
    }


@triton.jit
def _rotary_kernel(
    X,
    COS,
    SIN,
    O,
    stride_xh,
    stride_xt,
    stride_ct,
    stride_st,
    stride_oh,
    stride_ot,
    n_heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    in_half = d < HALF
    mask = (heads < n_heads)[:, None] & in_half[None, :]
    x_first = X + t * stride_xt + heads[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_first, mask=mask, other=0.0)
    x2 = tl.load(x_first + HALF, mask=mask, other=0.0)
    c1 = tl.load(COS + t * stride_ct + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    c2 = tl.load(COS + t * stride_ct + HALF + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    s1 = tl.load(SIN + t * stride_st + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    s2 = tl.load(SIN + t * stride_st + HALF + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    kind = x1.dtype
    # rotate_half(x) = [-x2, x1]; every product and the sum rounded to x's dtype, as torch's ops
    o1 = (x1.to(tl.float32) * c1).to(kind).to(tl.float32) + (-x2.to(tl.float32) * s1).to(kind).to(tl.float32)
    o2 = (x2.to(tl.float32) * c2).to(kind).to(tl.float32) + (x1.to(tl.float32) * s2).to(kind).to(tl.float32)
    o_first = O + t * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_first, o1.to(kind), mask=mask)
    tl.store(o_first + HALF, o2.to(kind), mask=mask)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [1, H, T, D] rotated by the tables [T, D] (rope.apply_rope's result, bitwise): a
    [1, H, T, D] view of a new [1, T, H, D] tensor, the layout torch's element-wise ops give the
    transposed heads of a fused projection."""
    if not rotary_launchable(x, cos, sin):
        raise ValueError(
            f"rotary kernel: x [1, H, T, D] with D even and a unit last stride, cos / sin [T, D] of its dtype; "
            f"got {tuple(x.shape)} {x.dtype} (strides {x.stride()}), {tuple(cos.shape)} {cos.dtype}, "
            f"{tuple(sin.shape)} {sin.dtype}"
        )
    _, n_heads, n_tokens, head_dim = x.shape
    out = torch.empty((1, n_tokens, n_heads, head_dim), dtype=x.dtype, device=x.device).transpose(1, 2)
    if out.numel() == 0:
        return out
    sizes = launch_constants(n_heads, head_dim)
    grid = (n_tokens, triton.cdiv(n_heads, sizes["BLOCK_H"]))
    _rotary_kernel[grid](
        x, cos, sin, out, x.stride(1), x.stride(2), cos.stride(0), sin.stride(0), out.stride(1), out.stride(2),
        n_heads, **sizes, **LAUNCH_OPTIONS,
    )  # fmt: skip
    return out
