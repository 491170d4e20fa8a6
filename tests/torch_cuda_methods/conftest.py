"""Model-level tests of H2O and speculative prefill on the torch backend: one thread, tiny models."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

torch = pytest.importorskip("torch")

from tests.torch_cuda_methods.methods_support import Tiny, load_tiny  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny(tiny_checkpoint: Callable[..., Path]) -> Callable[[str], Tiny]:
    """tiny(arch) -> the tiny random checkpoint as our fp32 CPU model and as the NumPy reference."""
    cache: dict[str, Tiny] = {}

    def build(arch: str) -> Tiny:
        if arch not in cache:
            cache[arch] = load_tiny(tiny_checkpoint(arch, "safetensors"))
        return cache[arch]

    return build
