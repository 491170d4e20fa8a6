"""What a backend registers to be checked: both methods' stages behind NumPy in, NumPy out."""

from __future__ import annotations

import importlib
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from specfill.core import AttentionState, BackendUnavailableError, H2OStages, SpecPrefillStages
from specfill.core.reference import ReferenceStages
from specfill.core.reference.kv_cache import ReferenceKVCache
from specfill.core.stages import AttentionTerms

from .ops_adapter import CacheAdapter, Convert


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


class ReferenceAdapter(ReferenceStages):
    """The NumPy reference itself, at float64 (exact) or float32."""

    name = "reference"
    dtypes = ("float64", "float32")

    def __init__(self, dtype: str = "float64", use_kernels: bool | None = None) -> None:
        if dtype not in self.dtypes:
            raise BackendUnavailableError(f"the reference runs in {' or '.join(self.dtypes)}, not {dtype}")
        self.dtype = dtype

    def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None):
        q, k, v = self._cast(q, k, v)
        return super().intra_attention(q, k, v, chunk_size, scale, window, self._terms(terms))

    def inter_attention(self, q, k_mem, v_mem, scale, window=None, terms=None):
        q, k_mem, v_mem = self._cast(q, k_mem, v_mem)
        return super().inter_attention(q, k_mem, v_mem, scale, window, self._terms(terms))

    def add_sinks(self, state, sinks):
        return super().add_sinks(AttentionState(*self._cast(state.m, state.l, state.o)), *self._cast(sinks))

    def attention_layer(self, q, k, v, config, scale, window=None, terms=None):
        q, k, v = self._cast(q, k, v)
        return super().attention_layer(q, k, v, config, scale, window, self._terms(terms))

    def attention_layer_from_prefix(self, q, k, v, prefix, config, scale, window=None, terms=None):
        q, k, v = self._cast(q, k, v)
        return super().attention_layer_from_prefix(q, k, v, prefix, config, scale, window, self._terms(terms))

    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None):
        queries, keys = self._cast(queries, keys)
        return super().attention_scores(queries, keys, scale, window, self._terms(terms), query_start)

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads):
        return super().reduce_colsum_to_kv_heads(self._cast(colsum)[0], n_kv_heads)

    def accumulate_scores(self, scores, memory, kv_colsum):
        return super().accumulate_scores(self._cast(scores)[0], memory, self._cast(kv_colsum)[0])

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy):
        return super().build_memory_set(
            self._cast(scores)[0], previous, chunk_index, chunk_start, chunk_end, local, heavy
        )

    def merge_states(self, a, b):
        cast = lambda s: AttentionState(*self._cast(s.m, s.l, s.o))  # noqa: E731
        return super().merge_states(cast(a), cast(b))

    def smooth_scores(self, probs, kernel):
        return super().smooth_scores(self._cast(probs)[0], kernel)

    def reduce_scores(self, probs, head_reduction, layer_reduction, lookahead_reduction="mean"):
        return super().reduce_scores(self._cast(probs)[0], head_reduction, layer_reduction, lookahead_reduction)

    def select_tokens(self, importance, config):
        return super().select_tokens(self._cast(importance)[0], config)

    def new_cache(self, n_layers, n_kv_heads, head_dim, capacity, value_dim=None) -> CacheAdapter:
        cast = lambda x: np.asarray(x, dtype=self.dtype)  # noqa: E731
        return CacheAdapter(
            ReferenceKVCache(n_layers, n_kv_heads, head_dim, capacity, self.dtype, value_dim),
            Convert(native=cast, stats=cast, index=lambda x: np.asarray(x, np.int64), numpy=np.asarray),
        )

    def _terms(self, terms):
        if terms is None or terms.sinks is None:
            return terms
        return AttentionTerms(self._cast(np.asarray(terms.sinks))[0], terms.softcap)

    def _cast(self, *arrays):
        return tuple(a.astype(self.dtype, copy=False) for a in arrays)


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
