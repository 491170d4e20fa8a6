"""Kernel-or-twin choice shared by the three stage dispatchers.

Triton is imported only when a kernel is actually launched, so the torch twins work without it
(macOS, CPU-only installs), and TRITON_INTERPRET=1 takes effect as long as it is set before the
first kernel launch (Triton reads it when it decorates the kernels).
"""
from __future__ import annotations

import importlib.util
import os

import torch

from specfill.core.errors import BackendUnavailableError

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def kernel_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton kernels cannot run on these tensors, or None when they can."""
    if not triton_installed():
        return "Triton is not installed (pip install 'specfill[cuda]' on Linux)"
    if device.type != "cuda" and not interpreting():
        return f"Triton kernels need CUDA tensors (got {device.type}); set TRITON_INTERPRET=1 to run them on CPU"
    if dtype not in KERNEL_DTYPES:
        return f"Triton kernels take float32, float16 or bfloat16 tensors, not {dtype}"
    return None


def use_triton(use_kernel: bool | None, *tensors: torch.Tensor) -> bool:
    """True to launch the Triton kernel, False for the torch twin.

    use_kernel None picks the kernel for CUDA tensors when it can run, True forces it (a clear
    error when it cannot), False forces the twin.
    """
    if use_kernel is False:
        return False
    first = tensors[0]
    reason = kernel_unavailable_reason(first.device, first.dtype)
    if use_kernel is None:
        return reason is None and first.device.type == "cuda"
    if reason is not None:
        raise BackendUnavailableError(reason)
    return True


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_tile(n: int, cap: int) -> int:
    """A power-of-2 tile >= 16 (the least size every tl.dot operand dimension may take on a GPU)
    that covers n when n is small, else `cap`."""
    return max(16, min(cap, next_power_of_2(n)))
