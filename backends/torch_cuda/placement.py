"""Where the torch backend's tensors live, and every question it asks the CUDA runtime.

The backend branches on "is this a CUDA tensor?" in a dozen places (dtype choice, attention
strategy, kernel dispatch, timing, memory reporting, doctor) and asks the CUDA runtime five
things (availability, name, capability, memory, synchronisation). Both go through this module:
`on_cuda` and `RUNTIME`. That is the seam that lets a machine without a GPU execute every
CUDA-only line: `simulated_cuda(runtime)` makes CPU tensors count as CUDA tensors and answers
the runtime questions from `runtime` (tests/torch_cuda/test_cuda_paths.py). Only the kernel
launch itself and torch's own CUDA kernels stay out of reach; scripts/aot_matrix.py compiles
the launches' kernels for real GPU targets instead.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple

import torch


class GpuProperties(NamedTuple):
    """What doctor reports of a GPU: name, total memory (bytes), compute capability."""

    name: str
    total_memory: int
    capability: tuple[int, int]


class CudaRuntime:
    """The CUDA runtime as torch exposes it; every call needs a CUDA build and a visible GPU,
    except `available`."""

    def available(self) -> bool:
        return torch.cuda.is_available()

    def properties(self, device: torch.device) -> GpuProperties:
        props = torch.cuda.get_device_properties(device)
        return GpuProperties(props.name, props.total_memory, (props.major, props.minor))

    def capability(self, device: torch.device) -> tuple[int, int]:
        return torch.cuda.get_device_capability(device)

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def peak_memory_bytes(self, device: torch.device) -> int:
        return torch.cuda.max_memory_allocated(device)

    def reset_peak_memory(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)


RUNTIME: CudaRuntime = CudaRuntime()
_SIMULATED = False


def on_cuda(where: torch.Tensor | torch.device | str) -> bool:
    """Whether a tensor (or device) is a CUDA one: its device type, or any CPU device while
    `simulated_cuda` is active."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    return device.type == "cuda" or (_SIMULATED and device.type == "cpu")


@contextmanager
def simulated_cuda(runtime: CudaRuntime) -> Iterator[CudaRuntime]:
    """Within the block, CPU tensors take every CUDA-only branch and `runtime` (a CudaRuntime
    subclass that needs no GPU) answers the runtime questions. For tests; not thread-safe."""
    global RUNTIME, _SIMULATED
    saved = RUNTIME, _SIMULATED
    RUNTIME, _SIMULATED = runtime, True
    try:
        yield runtime
    finally:
        RUNTIME, _SIMULATED = saved
