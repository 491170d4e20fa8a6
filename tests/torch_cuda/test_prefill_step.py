"""The torch backend's prefill step when none is asked: longer on a GPU with room for it
(loader.device_prefill_step: the H200 measured 16K steps 1.02-1.10x faster), the library's 2,048
on the CPU; an asked step is kept. GPUs are simulated (placement.simulated_cuda): what is read is
the runtime's total memory, the weights' bytes and the model's shape."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specfill.backends.torch_cuda import loader
from specfill.backends.torch_cuda.placement import GpuProperties, simulated_cuda
from specfill.core.driver import DEFAULT_PREFILL_STEP_SIZE
from specfill.core.io.random_model import random_model_args
from tests.torch_cuda.simulated_gpu import FakeRuntime

GIB = 1 << 30


class GpuOf(FakeRuntime):
    def __init__(self, total_bytes: int):
        super().__init__((9, 0))
        self.total = total_bytes

    def properties(self, device: torch.device) -> GpuProperties:
        return GpuProperties("Simulated GPU", self.total, self.cap)


def llama_8b_bf16() -> SimpleNamespace:
    """A CausalLM's two fields the rule reads: the shape, and 8.03e9 bf16 weights (meta: no memory)."""
    weights = torch.empty(8_030_000_000, dtype=torch.bfloat16, device="meta")
    return SimpleNamespace(
        args=random_model_args("random:llama-8b"), model=SimpleNamespace(parameters=lambda: [weights])
    )


@pytest.mark.parametrize(
    "total_gib,step",
    [(139.8, 16384), (40, 8192), (24, 4096), (20, DEFAULT_PREFILL_STEP_SIZE)],  # H200, A100-40GB, RTX 4090, 20 GB
)
def test_the_step_grows_with_the_room_the_weights_leave(total_gib, step):
    """8B bf16: 102,400 B of activations per step token (2 x 14,336 + 4 x 4,096 + 6,144 bf16 values),
    16.06 GB of weights: 24 GiB leaves 9.7 GB, whose twentieth (0.49 GB) holds a 4K step (0.42 GB) and
    no 8K one; 20 GiB leaves 5.4 GB (0.27 GB: not even 4K, so the library's 2,048)."""
    assert loader.step_activation_bytes(random_model_args("random:llama-8b"), 2) == 102_400
    with simulated_cuda(GpuOf(int(total_gib * GIB))):
        assert loader.device_prefill_step(llama_8b_bf16(), torch.device("cpu")) == step


def test_off_cuda_the_step_is_the_librarys_and_an_asked_one_is_kept():
    model, _ = loader.load("random:tiny-llama", device="cpu")
    assert model.prefill_step_size == DEFAULT_PREFILL_STEP_SIZE
    assert loader.device_prefill_step(llama_8b_bf16(), torch.device("cpu")) == DEFAULT_PREFILL_STEP_SIZE
    assert loader.load("random:tiny-llama", device="cpu", prefill_step_size=64)[0].prefill_step_size == 64
