"""MLX-only model-level tests: the methods on the Metal kernels against the MLX twins (a Mac) and
against the torch backend (the backend-neutral method tests are tests/methods). Skips the whole
folder where mlx is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import pytest

if importlib.util.find_spec("mlx") is None:  # a torch-only install: nothing here can run
    collect_ignore_glob = ["test_*.py"]
else:
    from tests.methods.support import Tiny, load_tiny

    @pytest.fixture(scope="session")
    def tiny(tiny_checkpoint: Callable[..., Path]) -> Callable[[str], Tiny]:
        """tiny(arch) -> the tiny random checkpoint as our fp32 MLX model and as the NumPy
        reference."""
        cache: dict[str, Tiny] = {}

        def build(arch: str) -> Tiny:
            if arch not in cache:
                cache[arch] = load_tiny("mlx", tiny_checkpoint(arch, "safetensors"))
            return cache[arch]

        return build
