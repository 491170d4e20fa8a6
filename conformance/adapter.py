"""What a backend registers to be checked: both methods' stages behind NumPy in, NumPy out."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from specfill.core import BackendUnavailableError, H2OStages, SpecPrefillStages
from specfill.core.reference import ReferenceStages
from specfill.core.reference.kv_cache import ReferenceKVCache

from .forwarding import Convert, StageBoundary, forward_stages
from .ops_adapter import CacheAdapter


@runtime_checkable
class ConformanceAdapter(H2OStages, SpecPrefillStages, Protocol):
    """A backend's stages at one compute dtype.

    name: the backend name ("reference", "cuda", "mlx"); dtype: the compute dtype checked
    ("float64", "float32", "float16", "bfloat16"). Inputs arrive as NumPy arrays already
    rounded to that dtype; outputs go back as NumPy arrays. A backend's factory is called as
    make_adapter(dtype=..., use_kernels=...): use_kernels True forces its custom kernels
    (Triton, Metal), False its ops twins, None lets its dispatcher choose.
    new_cache(n_layers, n_kv_heads, head_dim, capacity): the backend's KV cache in that dtype,
    behind the same boundary (conformance/ops_adapter.py's CacheAdapter).
    """

    name: str
    dtype: str

    def new_cache(
        self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, value_dim: int | None = None
    ) -> CacheAdapter: ...


def _reference_stage(adapter: ReferenceStages, name: str) -> Callable[..., Any]:
    """The reference's own stage `name` on `adapter` (a subclass's planted bug calls it by super())."""
    return getattr(super(ReferenceAdapter, adapter), name)


@forward_stages(_reference_stage, H2OStages, SpecPrefillStages)
class ReferenceAdapter(StageBoundary, ReferenceStages):
    """The NumPy reference itself, at float64 (exact) or float32: every stage forwarded to the
    reference's with its arrays cast to the dtype (forward_stages); its layer walks over the
    adapter itself, so a subclass that changes one stage (a planted bug) changes the whole layer."""

    name = "reference"
    dtypes = ("float64", "float32")

    def __init__(self, dtype: str = "float64", use_kernels: bool | None = None) -> None:
        if dtype not in self.dtypes:
            raise BackendUnavailableError(f"the reference runs in {' or '.join(self.dtypes)}, not {dtype}")
        self.dtype = dtype
        cast = lambda x: np.asarray(x).astype(dtype, copy=False)  # noqa: E731
        self.cv = Convert(native=cast, stats=cast, index=lambda x: np.asarray(x, np.int64), numpy=np.asarray)

    def new_cache(self, n_layers, n_kv_heads, head_dim, capacity, value_dim=None) -> CacheAdapter:
        return CacheAdapter(ReferenceKVCache(n_layers, n_kv_heads, head_dim, capacity, self.dtype, value_dim), self.cv)


# name -> "module:factory" (imported on first use) or the factory itself;
# a factory takes dtype= and use_kernels= and returns a ConformanceAdapter.
REGISTRY: dict[str, str | Callable[..., ConformanceAdapter]] = {
    "reference": "specfill.conformance.adapter:ReferenceAdapter",
    "cuda": "specfill.backends.torch_cuda.conformance:make_adapter",
    "mlx": "specfill.backends.mlx.conformance:make_adapter",
}
# compute dtypes a backend is checked at by default
DEFAULT_DTYPES: dict[str, tuple[str, ...]] = {
    "reference": ("float64", "float32"),
    "cuda": ("float32", "float16"),
    "mlx": ("float32", "float16"),
}


def adapter_factory(name: str) -> Callable[..., ConformanceAdapter]:
    """The registered factory for a backend, or a one-line error saying why there is none."""
    if name not in REGISTRY:
        raise BackendUnavailableError(f"unknown backend {name!r} (known: {', '.join(REGISTRY)})")
    entry = REGISTRY[name]
    if callable(entry):
        return entry
    module_name, attr = entry.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise BackendUnavailableError(
                f"backend {name!r} has no conformance adapter yet ({module_name} is missing)"
            ) from None
        raise BackendUnavailableError(
            f"backend {name!r} needs {err.name!r}, which is not installed (pip install 'specfill[{name}]')"
        ) from None
    return getattr(module, attr)
