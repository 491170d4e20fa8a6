"""Triton SwiGLU gating: model.MLP's `silu(gate) * up` in one launch.

`F.silu(gate, inplace=True).mul_(up)` is two element-wise kernels over the layer's largest
activation ([T, intermediate]): the SiLU reads and writes the gate, the product reads both and
writes again. A decode step of an 8B launches both in every layer (results/gpu/h200: a replayed
decode step is launch-bound, ~2.9 us a kernel); a 16K prefill step moves ~2.4 GB through them a
layer, where one pass reading gate and up and writing once moves ~1.4 GB. Here one program gates
a block of elements, writing over the gate (as the in-place pair does).

Rounded where torch rounds: SiLU in float32 as torch's CUDA kernel computes it,
`x / (1 + exp(-x))` with the precise expf (libdevice's) and an IEEE division, rounded to the
activation dtype, then the product in float32 rounded again: bitwise the pair on a GPU
(tests/torch_cuda_kernels/fused_cases.py). Triton's interpreter has no libdevice: there
`tl.exp` (NumPy's) stands in, which may differ from torch's CPU exp in float32's last place.

Imported lazily (backends/torch_cuda/model.py through kernels/dispatch.py): Triton decides at
decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from ..fused import swiglu_launchable
from .dispatch import interpreting

BLOCK = 1024  # elements a program: 8 a thread with 4 warps, 16-byte loads of 16-bit activations
LAUNCH_OPTIONS = {"num_warps": 4, "enable_fp_fusion": False}


@triton.jit
def _swiglu_kernel(G, U, n_elements, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_elements
    g = tl.load(G + offsets, mask=inside, other=0.0)
    u = tl.load(U + offsets, mask=inside, other=0.0)
    kind = g.dtype
    x = g.to(tl.float32)
    if LIBDEVICE:  # the GPU: torch's expf
        e = libdevice.exp(-x)
    else:  # the interpreter
        e = tl.exp(-x)
    silu = tl.math.div_rn(x, 1.0 + e).to(kind).to(tl.float32)
    tl.store(G + offsets, (silu * u.to(tl.float32)).to(kind), mask=inside)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up written over gate and returned (gate and up contiguous, one shape, one kernel
    dtype): bitwise `F.silu(gate, inplace=True).mul_(up)` on a GPU."""
    if not swiglu_launchable(gate, up):
        raise ValueError(
            f"swiglu kernel: gate and up contiguous, of one shape and dtype (float32, float16 or bfloat16); got "
            f"{tuple(gate.shape)} {gate.dtype} (contiguous {gate.is_contiguous()}), "
            f"{tuple(up.shape)} {up.dtype} (contiguous {up.is_contiguous()})"
        )
    n_elements = gate.numel()
    if n_elements:
        grid = (triton.cdiv(n_elements, BLOCK),)
        _swiglu_kernel[grid](gate, up, n_elements, BLOCK=BLOCK, LIBDEVICE=not interpreting(), **LAUNCH_OPTIONS)
    return gate
