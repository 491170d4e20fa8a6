"""Rotary position embedding from explicit per-token position ids.

Positions are a tensor, never an offset: speculative prefill feeds kept tokens at their original,
non-contiguous positions (e.g. [0, 1, 3, 6, 7]) and then decodes at the next prompt position.
Q/K use Hugging Face's rotate-half layout (the shared loader un-permutes llama.cpp's rows).
On CUDA the rotation is one Triton launch (kernels/rope_triton.py, bitwise the formula) instead of
torch's five element-wise kernels: a decode step rotates q and k in every layer and is launch-bound.
"""

from __future__ import annotations

import torch
from torch import nn

from specfill.core.models import ModelArgs
from specfill.core.rope import rope_inv_freq

from . import fused


class RotaryEmbedding(nn.Module):
    """Maps position ids [T] to (cos, sin) tables [T, head_dim] in the activation dtype.
    Frequencies (theta, linear / llama3 scaling) come from the shared spec in core.rope; `local`
    builds the sliding layers' table where the family gives them their own base (Gemma 3)."""

    def __init__(self, args: ModelArgs, local: bool = False):
        super().__init__()
        self.register_buffer("inv_freq", torch.from_numpy(rope_inv_freq(args, local)), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float32 whatever the model dtype: bf16 positions above 256 would round.
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by the tables [T, D] of its tokens' positions: x * cos +
    rotate_half(x) * sin, one Triton launch on a GPU (fused.py says when; bitwise this formula)."""
    if fused.kernel_runs(
        x, lambda: fused.rotary_launchable(x, cos, sin), lambda: fused.rotary_self_check(x, rope_formula)
    ):
        from .kernels import dispatch

        return dispatch.triton_kernel("rotary")(x, cos, sin)
    return rope_formula(x, cos, sin)


def rotate_and_store(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor | None,
    start: int = 0,
) -> torch.Tensor | None:
    """A layer's query and key heads qk [1, H + Hkv, T, D] rotated, the keys and v [1, Hkv, T, D] written
    into the layer's caches [1, Hkv, capacity, D] at `slots` [T] (None: start.. start + T), in one
    Triton launch on a GPU (kernels/rope_triton.rotary_store, bitwise apply_rope and the writes; fused.py
    says when): the rotated query heads [1, H, T, D]; None where the kernel does not run (the caller
    rotates with apply_rope and writes the cache itself: three launches)."""
    if not fused.kernel_runs(
        qk,
        lambda: fused.rotary_store_launchable(qk, v, cos, sin, n_heads, k_cache, v_cache),
        lambda: fused.rotary_store_self_check(qk, rope_formula),
    ):
        return None
    from .kernels import dispatch

    return dispatch.triton_kernel("rotary_store")(qk, v, cos, sin, n_heads, k_cache, v_cache, slots, start)


def rope_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's rotate-half RoPE in torch's element-wise ops (the CPU path; the kernel's twin)."""
    return x * cos + rotate_half(x) * sin
