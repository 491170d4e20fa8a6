"""Backends: `mlx` (MLX + Metal kernels) and `torch_cuda` (PyTorch + Triton kernels), found by name here.

Each backend package holds one Backend object (core/backend.py), `BACKEND` in its __init__: load(path,
dtype=None, device=None) -> (model, tokenizer), available(), resolve_device / resolve_dtype and its CPU
fallback, all implemented by its loader.py. Both packages have the same module names for the same
parts: loader.py (load(): device and dtype resolution, checkpoint -> model), weights.py, model.py, rope.py, cache.py
(the KV cache, core/ops.py's KVCache), ops.py (core/ops.py's ModelOps), method_ops.py,
kernels/ (the hot stages), adapter.py / adapted.py / adapted_loader.py (another library's model with
the attention adapted), conformance.py (the conformance suite's adapter); both kernels/ packages ask
kernel_fallback.py here when a kernel gives way to its twin. Importing a backend package
(and so its Backend object) imports neither torch nor mlx: loader.py does, on the first load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from specfill.core.errors import BackendUnavailableError

if TYPE_CHECKING:
    from specfill.core.backend import Backend

# Every backend name the CLI, the API and the server accept -> the package holding its BACKEND.
REGISTRY = {"cuda": "specfill.backends.torch_cuda", "mlx": "specfill.backends.mlx"}
ALIASES = {"torch": "cuda"}  # the torch backend answers to both names; "cuda" is the one reported


def canonical_name(name: str) -> str:
    """A backend's one name: "torch" -> "cuda"; other names as they are."""
    return ALIASES.get(name, name)


def get_backend(name: str) -> Backend:
    """The Backend object of `name` (or an alias); BackendUnavailableError for an unknown name."""
    name = canonical_name(name)
    if name not in REGISTRY:
        raise BackendUnavailableError(f"unknown backend {name!r} (choose from mlx, cuda or torch)")
    return importlib.import_module(REGISTRY[name]).BACKEND
