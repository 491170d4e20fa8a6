"""Kernel-or-twin choice shared by the three stage dispatchers.

Triton is imported only when a kernel is actually launched, so the torch twins work without it
(macOS, CPU-only installs), and TRITON_INTERPRET=1 takes effect as long as it is set before the
first kernel launch (Triton reads it when it decorates the kernels).

The kernel setting: use_kernel True / False forces the kernel / the twin; None reads
SPECFILL_KERNELS (auto | on | off, unset = auto). In auto, a kernel runs only after passing its
first-use self-check (core/self_check.py) for its dtype and shape class.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from functools import partial
from typing import Callable

import torch

import specfill.backends.torch_cuda.placement as placement  # a module reference: simulated_cuda swaps RUNTIME
from specfill.backends import kernel_fallback
from specfill.core.errors import BackendUnavailableError
from specfill.core.self_check import kernels_setting
from specfill.core.self_check_cases import CheckCases

from .tiles import architecture

# the Triton kernel behind each name, in the module that builds it (imported on first use)
TRITON_KERNELS = {
    "flash_attention": "flash_triton",
    "scoring_softmax": "scoring_triton",
    "decode_attention": "decode_triton",
    "prefill_attention": "prefill_triton",
    "rotary": "rope_triton",
    "rotary_store": "rope_triton",
    "rms_norm": "norm_triton",
    "swiglu": "swiglu_triton",
    "lse_merge": "merge_triton",
}

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# kernel_runs(stage, kernel, terms, masked, value_dim_differs=False): kernel_fallback.kernel_runs on torch
kernel_runs = partial(kernel_fallback.kernel_runs, "cuda", "the torch twin")


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported (looked up once: every stage's dispatch asks, and the lookup
    walks sys.path, 0.3 s of a 32K composition's 84 s)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def kernel_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton kernels cannot run on these tensors, or None when they can."""
    if not triton_installed():
        return "Triton is not installed (pip install 'specfill[cuda]' on Linux)"
    if not placement.on_cuda(device) and not interpreting():
        return f"Triton kernels need CUDA tensors (got {device.type}); set TRITON_INTERPRET=1 to run them on CPU"
    if dtype not in KERNEL_DTYPES:
        return f"Triton kernels take float32, float16 or bfloat16 tensors, not {dtype}"
    return None


def triton_kernel(name: str) -> Callable:
    """The Triton kernel `name` (flash_attention, scoring_softmax, decode_attention,
    prefill_attention, rotary, rotary_store, rms_norm, swiglu, lse_merge), importing Triton on first use.

    The one place a kernel is fetched, so that a test can inject a failing or wrong one."""
    module = importlib.import_module(f"{__package__}.{TRITON_KERNELS[name]}")
    return getattr(module, name)


def device_arch(device: torch.device) -> int:
    """The listed GPU target (tiles.py) whose kernel tiles `device` takes; CPU tensors (forced
    kernel runs outside the interpreter fail at launch anyway) take sm_80's."""
    capability = placement.RUNTIME.capability(device) if placement.on_cuda(device) else None
    return architecture(capability)


def kernel_device_auto(device: torch.device) -> bool:
    """Whether auto mode picks the kernel for tensors on `device`: CUDA only (the interpreter is
    for forced runs)."""
    return placement.on_cuda(device)


def choose_kernel(
    use_kernel: bool | None, *tensors: torch.Tensor, self_check: Callable[[], bool] | None = None
) -> bool:
    """True to launch the Triton kernel, False for the torch twin.

    use_kernel None reads SPECFILL_KERNELS; auto picks the kernel for CUDA tensors when it can
    run and `self_check()` (the first-use self-check, run once per process and key) passes; True
    forces it (a clear error when it cannot), False forces the twin.
    """
    use_kernel = kernels_setting(use_kernel)
    if use_kernel is False:
        return False
    first = tensors[0]
    reason = kernel_unavailable_reason(first.device, first.dtype)
    if use_kernel is None:
        return reason is None and kernel_device_auto(first.device) and (self_check is None or self_check())
    if reason is not None:
        raise BackendUnavailableError(reason)
    return True


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_tile(n: int, cap: int) -> int:
    """A power-of-2 tile >= 16 (the least size every tl.dot operand dimension may take on a GPU)
    that covers n when n is small, else `cap`."""
    return max(16, min(cap, next_power_of_2(n)))


def _case_random(shape: tuple[int, ...], like: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device=like.device, dtype=like.dtype)


# the first-use self-check's seeded cases on the caller's device (core/self_check_cases.py)
SELF_CHECK = CheckCases(
    "cuda",
    "the torch twin",
    _case_random,
    lambda x: x.detach().to(device="cpu", dtype=torch.float64).numpy(),
    lambda dtype: str(dtype).removeprefix("torch."),
)
