"""Rotary position embedding from explicit per-token position ids.

Positions are a tensor, never an offset: speculative prefill feeds kept tokens at their original,
non-contiguous positions (e.g. [0, 1, 3, 6, 7]) and then decodes at the next prompt position.
Q/K use Hugging Face's rotate-half layout (the shared loader un-permutes llama.cpp's rows).
On CUDA the rotation is one Triton launch (kernels/rope_triton.py, bitwise the formula) instead of
torch's five element-wise kernels: a decode step rotates q and k in every layer and is launch-bound.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from specfill.core.models import ModelArgs
from specfill.core.rope import rope_inv_freq


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
    rotate_half(x) * sin, computed by the Triton kernel where `rotary_kernel_runs` says so."""
    if rotary_kernel_runs(x, cos, sin):
        from .kernels import dispatch

        return dispatch.triton_kernel("rotary")(x, cos, sin)
    return x * cos + rotate_half(x) * sin


def rotary_launchable(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the rotary kernel takes these operands: x [1, H, T, D] in a kernel dtype (any head /
    token strides, a unit last stride, D even), cos / sin [T, D] of x's dtype, unit last strides."""
    from .kernels import dispatch

    if x.dim() != 4 or x.shape[0] != 1 or x.shape[-1] % 2 or x.stride(-1) != 1 or x.dtype not in dispatch.KERNEL_DTYPES:
        return False
    table = (x.shape[2], x.shape[3])
    return all(t.dtype == x.dtype and tuple(t.shape) == table and t.stride(-1) == 1 for t in (cos, sin))


def rotary_kernel_runs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The kernel rotates x on a GPU (or forced, under TRITON_INTERPRET=1) when the kernel setting
    allows it and, in auto, its first-use self-check passed; never inside torch.compile (inductor
    fuses the formula itself), never on CPU tensors (the formula is the CPU path, which imports no kernel)."""
    if torch.compiler.is_compiling() or (not x.is_cuda and "TRITON_INTERPRET" not in os.environ):
        return False  # first: a traced step reads nothing else here
    from .kernels import dispatch

    if not (x.is_cuda or dispatch.interpreting()):
        return False
    if not rotary_launchable(x, cos, sin):
        return False
    return dispatch.choose_kernel(None, x, self_check=lambda: _self_check(x))


def _self_check(like: torch.Tensor) -> bool:
    """The kernel against the formula on a seeded [1, 3, 5, D] case of like's dtype and head dim."""
    from specfill.core.self_check import KERNEL_SELF_CHECK

    from .kernels import dispatch

    head_dim = like.shape[-1]

    def run():
        x = dispatch.SELF_CHECK.random((1, 5, 3, head_dim), like, 6).transpose(1, 2)
        cos, sin = (dispatch.SELF_CHECK.random((5, head_dim), like, seed) for seed in (7, 8))
        got = dispatch.triton_kernel("rotary")(x, cos, sin)
        return dispatch.SELF_CHECK.tensor_comparisons("rotated", got, x * cos + rotate_half(x) * sin)

    shape_class = f"D={head_dim}"
    dtype = dispatch.SELF_CHECK.dtype_name(like.dtype)
    return KERNEL_SELF_CHECK.passes("cuda", "rotary embedding", dtype, shape_class, dispatch.SELF_CHECK.twin, run)
