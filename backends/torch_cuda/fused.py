"""When the decoder's fused element-wise kernels run: RoPE (kernels/rope_triton.py), RMSNorm with
its residual add (kernels/norm_triton.py) and SwiGLU's gating (kernels/swiglu_triton.py), each one
Triton launch where torch launches several.

A decode step is launch-bound on a GPU (results/gpu/h200/2026-11-29), so these run on CUDA tensors
when the kernel setting allows (SPECFILL_KERNELS / `--kernels`, which the attention probe's Triton
candidates read too; a loader's `use_kernels` picks the H2O / SpecPrefill stage kernels only; in
auto: after the kernel's first-use self-check passed for the dtype and width), or forced under
TRITON_INTERPRET=1 (the tests); never inside torch.compile (inductor fuses the formulas itself; the
gate is the first thing a traced step reads) and never on CPU tensors, whose path is the formula and
imports no kernel module.
"""

from __future__ import annotations

import os
from typing import Callable

import torch


def kernel_runs(x: torch.Tensor, launchable: Callable[[], bool], self_check: Callable[[], bool]) -> bool:
    """Whether the fused kernel takes x: see the module doc. launchable(): the kernel takes the operands."""
    if torch.compiler.is_compiling() or (not x.is_cuda and "TRITON_INTERPRET" not in os.environ):
        return False
    from .kernels import dispatch

    if not (x.is_cuda or dispatch.interpreting()) or not launchable():
        return False
    return dispatch.choose_kernel(None, x, self_check=self_check)


def kernel_dtype(x: torch.Tensor) -> bool:
    from .kernels.dispatch import KERNEL_DTYPES

    return x.dtype in KERNEL_DTYPES


def rotary_launchable(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The rotary kernel takes x [1, H, T, D] in a kernel dtype (any head / token strides, a unit last
    stride, D even) and cos / sin [T, D] of x's dtype with unit last strides."""
    if x.dim() != 4 or x.shape[0] != 1 or x.shape[-1] % 2 or x.stride(-1) != 1 or not kernel_dtype(x):
        return False
    table = (x.shape[2], x.shape[3])
    return all(t.dtype == x.dtype and tuple(t.shape) == table and t.stride(-1) == 1 for t in (cos, sin))


def rotary_store_launchable(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> bool:
    """The rotary-and-store kernel takes what the rotary kernel takes (qk [1, H + Hkv, T, D]), v [1, Hkv,
    T, D] and caches [1, Hkv, capacity, D] of qk's dtype, every one with a unit last stride."""
    if not rotary_launchable(qk, cos, sin) or not 0 < n_heads < qk.shape[1]:
        return False
    rows = (1, qk.shape[1] - n_heads)
    return all(
        t.dim() == 4 and tuple(t.shape[:2]) == rows and t.shape[3] == qk.shape[3] and t.stride(-1) == 1
        and t.dtype == qk.dtype
        for t in (v, k_cache, v_cache)
    ) and v.shape[2] == qk.shape[2]  # fmt: skip


def norm_launchable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The RMSNorm kernel takes x [1, T, n] or [1, T, H, n] (per-head norms) in a kernel dtype with a
    unit last stride, weight [n] of x's dtype, contiguous."""
    if x.dim() not in (3, 4) or x.shape[0] != 1 or x.stride(-1) != 1 or not kernel_dtype(x):
        return False
    return weight.dtype == x.dtype and tuple(weight.shape) == (x.shape[-1],) and weight.is_contiguous()


def swiglu_launchable(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """The SwiGLU kernel takes gate and up contiguous, of one shape and one kernel dtype."""
    return (
        kernel_dtype(gate)
        and gate.dtype == up.dtype
        and gate.shape == up.shape
        and gate.is_contiguous()
        and up.is_contiguous()
    )


def _passes(kernel: str, like: torch.Tensor, width: int | None, run: Callable[[], list]) -> bool:
    from specfill.core.self_check import KERNEL_SELF_CHECK

    from .kernels.dispatch import SELF_CHECK

    dtype = SELF_CHECK.dtype_name(like.dtype)
    shape_class = "any" if width is None else f"D={width}"
    return KERNEL_SELF_CHECK.passes("cuda", kernel, dtype, shape_class, SELF_CHECK.twin, run)


def rotary_self_check(like: torch.Tensor, formula: Callable[..., torch.Tensor]) -> bool:
    """The rotary kernel against `formula` (rope.rope_formula) on a seeded [1, 3, 5, D] case of like's
    dtype and head dim."""
    from .kernels import dispatch

    head_dim = like.shape[-1]

    def run() -> list:
        x = dispatch.SELF_CHECK.random((1, 5, 3, head_dim), like, 6).transpose(1, 2)
        cos, sin = (dispatch.SELF_CHECK.random((5, head_dim), like, seed) for seed in (7, 8))
        got = dispatch.triton_kernel("rotary")(x, cos, sin)
        return dispatch.SELF_CHECK.tensor_comparisons("rotated", got, formula(x, cos, sin))

    return _passes("rotary embedding", like, head_dim, run)


def rotary_store_self_check(like: torch.Tensor, formula: Callable[..., torch.Tensor]) -> bool:
    """The rotary-and-store kernel against `formula` and index_copy_ on a seeded case of like's dtype and
    head dim: 3 query and 2 KV heads of 2 tokens written at slots 4 and 1 of a 6-slot cache."""
    from .kernels import dispatch

    head_dim = like.shape[-1]

    def run() -> list:
        qk = dispatch.SELF_CHECK.random((1, 2, 7, head_dim), like, 14).transpose(1, 2)[:, :5]
        v = dispatch.SELF_CHECK.random((1, 2, 2, head_dim), like, 15).transpose(1, 2)
        cos, sin = (dispatch.SELF_CHECK.random((2, head_dim), like, seed) for seed in (16, 17))
        caches = [dispatch.SELF_CHECK.random((1, 2, 6, head_dim), like, seed) for seed in (18, 19)]
        slots = torch.tensor([4, 1], device=like.device)
        want_q, want_k = formula(qk, cos, sin).split((3, 2), dim=1)
        want_caches = [c.clone().index_copy_(2, slots, x) for c, x in zip(caches, (want_k, v))]
        got_q = dispatch.triton_kernel("rotary_store")(qk, v, cos, sin, 3, *caches, slots)
        checks = dispatch.SELF_CHECK.tensor_comparisons("rotated queries", got_q, want_q)
        for name, got, want in zip(("keys", "values"), caches, want_caches):
            checks += dispatch.SELF_CHECK.tensor_comparisons(f"cached {name}", got, want)
        return checks

    return _passes("rotary store", like, head_dim, run)


def norm_self_check(like: torch.Tensor, eps: float) -> bool:
    """The RMSNorm kernel (residual add fused) against the formula on a seeded [1, 5, n] case."""
    import torch.nn.functional as F

    from .kernels import dispatch

    width = like.shape[-1]

    def run() -> list:
        x, residual = (dispatch.SELF_CHECK.random((1, 5, width), like, seed) for seed in (9, 10))
        weight = dispatch.SELF_CHECK.random((width,), like, 11)
        want_h = x + residual
        want = weight * F.rms_norm(want_h, (width,), eps=eps)
        h, got = dispatch.triton_kernel("rms_norm")(x.clone(), weight, eps, residual)
        return dispatch.SELF_CHECK.tensor_comparisons("sum", h, want_h) + dispatch.SELF_CHECK.tensor_comparisons(
            "normalised", got, want
        )

    return _passes("rms norm", like, width, run)


def swiglu_self_check(like: torch.Tensor) -> bool:
    """The SwiGLU kernel against the in-place pair on a seeded [1, 5, 300] case of like's dtype (the
    kernel is element-wise: one check a dtype), gates of scale 4 (SiLU's tails and its middle)."""
    import torch.nn.functional as F

    from .kernels import dispatch

    def run() -> list:
        gate = dispatch.SELF_CHECK.random((1, 5, 300), like, 12) * 4
        up = dispatch.SELF_CHECK.random((1, 5, 300), like, 13)
        want = F.silu(gate.clone()).mul_(up)
        got = dispatch.triton_kernel("swiglu")(gate, up)
        return dispatch.SELF_CHECK.tensor_comparisons("gated", got, want)

    return _passes("swiglu", like, None, run)
