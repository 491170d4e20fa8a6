"""Model-level tests of H2O and speculative prefill on the MLX backend (CPU here, Metal on a
Mac): tiny fp32 models against the NumPy reference, and against the torch backend."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("mlx.core")

from tests.mlx_methods.methods_support import Tiny, load_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tiny_checkpoint: Callable[..., Path]) -> Callable[[str], Tiny]:
    """tiny(arch) -> the tiny random checkpoint as our fp32 MLX model and as the NumPy reference."""
    cache: dict[str, Tiny] = {}

    def build(arch: str) -> Tiny:
        if arch not in cache:
            cache[arch] = load_tiny(tiny_checkpoint(arch, "safetensors"))
        return cache[arch]

    return build
