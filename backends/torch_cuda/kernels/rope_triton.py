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

from ..fused import rotary_launchable, rotary_store_launchable
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
def _rotated_halves(x_first, COS, SIN, t, stride_ct, stride_st, d, in_half, mask, HALF: tl.constexpr):
    """The two halves of each head at x_first [heads, BLOCK_D] (its first half's addresses) rotated by
    token t's tables: each product and the sum computed in float32 and rounded to x's dtype where torch
    rounds them (rotate_half(x) = [-x2, x1]; the negation is exact). Both kernels' rotation, written once."""
    x1 = tl.load(x_first, mask=mask, other=0.0)
    x2 = tl.load(x_first + HALF, mask=mask, other=0.0)
    c1 = tl.load(COS + t * stride_ct + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    c2 = tl.load(COS + t * stride_ct + HALF + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    s1 = tl.load(SIN + t * stride_st + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    s2 = tl.load(SIN + t * stride_st + HALF + d, mask=in_half, other=0.0)[None, :].to(tl.float32)
    kind = x1.dtype
    o1 = (x1.to(tl.float32) * c1).to(kind).to(tl.float32) + (-x2.to(tl.float32) * s1).to(kind).to(tl.float32)
    o2 = (x2.to(tl.float32) * c2).to(kind).to(tl.float32) + (x1.to(tl.float32) * s2).to(kind).to(tl.float32)
    return o1.to(kind), o2.to(kind)


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
    o1, o2 = _rotated_halves(x_first, COS, SIN, t, stride_ct, stride_st, d, in_half, mask, HALF)
    o_first = O + t * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_first, o1, mask=mask)
    tl.store(o_first + HALF, o2, mask=mask)


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


@triton.jit
def _rotary_store_kernel(
    X,
    V,
    COS,
    SIN,
    O,
    KC,
    VC,
    SLOTS,
    stride_xh,
    stride_xt,
    stride_vh,
    stride_vt,
    stride_ct,
    stride_st,
    stride_oh,
    stride_ot,
    stride_kch,
    stride_kct,
    stride_vch,
    stride_vct,
    start,
    n_heads,
    n_kv,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_SLOTS: tl.constexpr,
):
    """Heads 0..n_heads - 1 of X rotated into O, heads n_heads.. (the keys) rotated into the key cache
    KC at the token's slot, and the value heads of V copied into VC there: one token, BLOCK_H of the
    n_heads + 2 n_kv heads, per program."""
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    in_half = d < HALF
    is_q = heads < n_heads
    is_k = (heads >= n_heads) & (heads < n_heads + n_kv)
    is_v = (heads >= n_heads + n_kv) & (heads < n_heads + 2 * n_kv)
    slot = tl.load(SLOTS + t) if USE_SLOTS else start + t
    rotated = (is_q | is_k)[:, None] & in_half[None, :]
    x_first = X + t * stride_xt + heads[:, None] * stride_xh + d[None, :]
    o1, o2 = _rotated_halves(x_first, COS, SIN, t, stride_ct, stride_st, d, in_half, rotated, HALF)
    q_mask = is_q[:, None] & in_half[None, :]
    o_first = O + t * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_first, o1, mask=q_mask)
    tl.store(o_first + HALF, o2, mask=q_mask)
    k_mask = is_k[:, None] & in_half[None, :]
    k_first = KC + slot * stride_kct + (heads - n_heads)[:, None] * stride_kch + d[None, :]
    tl.store(k_first, o1, mask=k_mask)
    tl.store(k_first + HALF, o2, mask=k_mask)
    v_mask = is_v[:, None] & in_half[None, :]
    v_heads = heads - n_heads - n_kv
    v1 = tl.load(V + t * stride_vt + v_heads[:, None] * stride_vh + d[None, :], mask=v_mask, other=0.0)
    v2 = tl.load(V + t * stride_vt + v_heads[:, None] * stride_vh + HALF + d[None, :], mask=v_mask, other=0.0)
    v_first = VC + slot * stride_vct + v_heads[:, None] * stride_vch + d[None, :]
    tl.store(v_first, v1, mask=v_mask)
    tl.store(v_first + HALF, v2, mask=v_mask)


def rotary_store(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor | None,
    start: int = 0,
) -> torch.Tensor:
    """A layer's query and key heads qk [1, H + Hkv, T, D] rotated by the tables [T, D] (rotary's
    arithmetic: bitwise the formula), the H query heads returned as rotary returns them ([1, H, T, D], a
    view of a new [1, T, H, D]), the keys written into k_cache [1, Hkv, capacity, D] and v [1, Hkv, T, D]
    into v_cache at the step's slots: `slots` [T] (int64, on the device: a static decode step's) or
    start.. start + T. One launch where the rotation and the two cache writes were three."""
    if not rotary_store_launchable(qk, v, cos, sin, n_heads, k_cache, v_cache):
        raise ValueError(
            f"rotary_store kernel: qk [1, H + Hkv, T, D], v [1, Hkv, T, D] and caches [1, Hkv, S, D] of one dtype "
            f"with unit last strides, D even; got qk {tuple(qk.shape)} {qk.dtype}, v {tuple(v.shape)} {v.dtype}, "
            f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}, {n_heads} query heads"
        )
    _, rotated, n_tokens, head_dim = qk.shape
    n_kv = rotated - n_heads
    out = torch.empty((1, n_tokens, n_heads, head_dim), dtype=qk.dtype, device=qk.device).transpose(1, 2)
    if n_tokens == 0:
        return out
    sizes = launch_constants(n_heads + 2 * n_kv, head_dim)
    grid = (n_tokens, triton.cdiv(n_heads + 2 * n_kv, sizes["BLOCK_H"]))
    _rotary_store_kernel[grid](
        qk, v, cos, sin, out, k_cache, v_cache, slots if slots is not None else out,
        qk.stride(1), qk.stride(2), v.stride(1), v.stride(2), cos.stride(0), sin.stride(0), out.stride(1),
        out.stride(2), k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2), start,
        n_heads, n_kv, **sizes, USE_SLOTS=slots is not None, **LAUNCH_OPTIONS,
    )  # fmt: skip
    return out
