"""Model-level tests of H2O and speculative prefill, one suite run on every installed backend
(torch on CPU with one thread; MLX on its CPU device here, Metal on a Mac): tiny fp32 models
against the NumPy reference. A backend that is not installed skips with its reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import pytest

from tests.methods.support import BACKENDS, MODULES, Tiny, load_tiny


@pytest.fixture(params=BACKENDS, scope="session")
def backend(request) -> str:
    name = request.param
    if importlib.util.find_spec(MODULES[name].split(".")[0]) is None:
        pytest.skip(f"the {name} backend needs {MODULES[name]}, which is not installed")
    if name == "cuda":
        import torch

        torch.set_num_threads(1)
    return name


@pytest.fixture(scope="session")
def _tiny_cache() -> dict[tuple[str, str], Tiny]:
    return {}


@pytest.fixture
def tiny(
    backend: str, tiny_checkpoint: Callable[..., Path], _tiny_cache: dict[tuple[str, str], Tiny]
) -> Callable[[str], Tiny]:
    """tiny(arch) -> the tiny random checkpoint as our fp32 model on `backend` and as the NumPy reference."""

    def build(arch: str) -> Tiny:
        if (backend, arch) not in _tiny_cache:
            _tiny_cache[(backend, arch)] = load_tiny(backend, tiny_checkpoint(arch, "safetensors"))
        return _tiny_cache[(backend, arch)]

    return build
