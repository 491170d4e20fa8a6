"""A GPU that is not there: CPU tensors take the torch backend's CUDA-only branches.

`simulated(monkeypatch, capability)` enters placement.simulated_cuda with a FakeRuntime (answers
name, capability, memory; counts synchronisations) and replaces the three Triton kernels'
launches by FakeLaunch objects: each records its grid and keyword arguments (tiles, warps,
stages: the launch the GPU would get) and fills the outputs with the torch twin's result, in the
units the real kernel writes (m in log2 units), so everything after the launch runs for real.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from specfill.backends.torch_cuda.placement import CudaRuntime, GpuProperties, simulated_cuda

LOG2E = 1.4426950408889634


class FakeRuntime(CudaRuntime):
    """A runtime with one GPU of the given capability, 24 GB, 3 GB peak allocation."""

    def __init__(self, capability: tuple[int, int] = (8, 9)):
        self.cap = capability
        self.synchronized = 0

    def available(self) -> bool:
        return True

    def properties(self, device: torch.device) -> GpuProperties:
        return GpuProperties("Simulated GPU", 24 * 10**9, self.cap)

    def capability(self, device: torch.device) -> tuple[int, int]:
        return self.cap

    def synchronize(self, device: torch.device) -> None:
        self.synchronized += 1

    def peak_memory_bytes(self, device: torch.device) -> int:
        return 3 * 10**9

    def reset_peak_memory(self, device: torch.device) -> None:
        pass


class FakeLaunch:
    """Stands in for `kernel[grid](*args, **kwargs)`; `fill(args, kwargs)` writes the outputs."""

    def __init__(self, fill):
        self.fill = fill
        self.launches: list[tuple[tuple, dict[str, Any]]] = []

    def __getitem__(self, grid: tuple):
        def launch(*args, **kwargs):
            self.launches.append((grid, kwargs))
            self.fill(args, kwargs)

        return launch


def _forward_fill(args, kwargs) -> None:
    from specfill.backends.torch_cuda.kernels.inter import inter_attention_twin
    from specfill.backends.torch_cuda.kernels.intra import intra_attention_twin

    q, k, v, o, m, l = args[:6]
    scale = kwargs["qk_scale"] / LOG2E
    if kwargs["BLOCK_DIAGONAL"]:
        state = intra_attention_twin(q, k, v, kwargs["chunk_size"], scale, with_colsum=False).state
    else:
        state = inter_attention_twin(q, k, v, scale, with_colsum=False).state
    o.copy_(state.o)
    m.copy_(state.m * LOG2E)  # the kernel's m is in log2 units; flash_attention converts
    l.copy_(state.l)


def _colsum_fill(args, kwargs) -> None:
    from specfill.backends.torch_cuda.kernels.inter import inter_attention_twin
    from specfill.backends.torch_cuda.kernels.intra import intra_attention_twin

    q, k, _, _, colsum = args[:5]
    scale = kwargs["qk_scale"] / LOG2E
    if kwargs["BLOCK_DIAGONAL"]:
        result = intra_attention_twin(q, k, k, kwargs["chunk_size"], scale)
    else:
        result = inter_attention_twin(q, k, k, scale)
    colsum.copy_(result.colsum)


def _scoring_fill(args, kwargs) -> None:
    from specfill.backends.torch_cuda.kernels.scoring import attention_scores_twin

    if kwargs["STATS"]:  # the key ranges' statistics: only the probabilities' launch writes what is read
        return
    queries, keys, probs = args[:3]
    query_start, scale = args[-3], args[-2] / LOG2E  # the runtime arguments before split_keys, the last
    probs.copy_(attention_scores_twin(queries, keys, scale, query_start=query_start))


@contextmanager
def simulated(monkeypatch, capability: tuple[int, int] = (8, 9)) -> Iterator[dict[str, Any]]:
    """{"runtime", "forward", "colsum", "scoring"}: the fake runtime and the three fake launches."""
    from specfill.backends.torch_cuda.kernels import flash_triton, scoring_triton
    from specfill.core.self_check import KERNEL_SELF_CHECK

    fakes = {
        "forward": FakeLaunch(_forward_fill),
        "colsum": FakeLaunch(_colsum_fill),
        "scoring": FakeLaunch(_scoring_fill),
    }
    monkeypatch.setattr(flash_triton, "_forward_kernel", fakes["forward"])
    monkeypatch.setattr(flash_triton, "_colsum_kernel", fakes["colsum"])
    monkeypatch.setattr(scoring_triton, "_scoring_kernel", fakes["scoring"])
    KERNEL_SELF_CHECK.reset()  # first-use self-checks run again, against the fake launches
    try:
        with simulated_cuda(FakeRuntime(capability)) as runtime:
            yield {"runtime": runtime, **fakes}
    finally:
        KERNEL_SELF_CHECK.reset()
