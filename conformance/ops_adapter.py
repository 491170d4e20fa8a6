"""One conformance adapter for every backend: its ops (core/ops.py) behind NumPy in, NumPy out.

Inputs arrive as float64 NumPy arrays already rounded to the dtype under test; the backend's
`Convert` turns them into its arrays and results back into NumPy. The stages are forwarded to the
backend's ops as the stage protocol declares them (conformance/forwarding.py); `attention_layer`
runs the one walk of core/h2o_walk.py over the backend's ops; the reductions compose its
reduce_axis; selection runs on the host for every backend (core/methods/selection.py, the
production selection, which the suite holds to the reference's spec), from the importance computed
in the statistics dtype. `new_cache` makes the backend's KV cache (core/ops.py's KVCache) behind
the same boundary (`CacheAdapter`), for the cache's checks against core/reference/kv_cache.py.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.h2o_walk import h2o_attention_layer
from specfill.core.methods.selection import select_tokens
from specfill.core.ops import ModelOps
from specfill.core.stages import H2OLayerResult, H2OStageOps, ScoringStageOps, Selection

from .forwarding import Convert, StageBoundary, forward_stages


class CacheAdapter:
    """A KV cache (core/ops.py's KVCache) behind NumPy in, NumPy out: keys and values go in
    through `native`, what the cache holds comes back through `numpy`."""

    def __init__(self, cache: Any, convert: Convert) -> None:
        self.cache, self.cv = cache, convert

    def write(self, layer: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """keys/values [1, Hkv, T, D] into one layer's next T slots; every filled slot's back."""
        got_k, got_v = self.cache.layers[layer].update_and_fetch(self.cv.native(keys), self.cv.native(values))
        return self.cv.numpy(got_k), self.cv.numpy(got_v)

    def offsets(self) -> list[int]:
        return [int(layer.offset) for layer in self.cache.layers]

    @property
    def filled(self) -> int:
        return int(self.cache.filled)

    @property
    def capacity(self) -> int:
        return int(self.cache.capacity)

    def grown(self, capacity: int) -> CacheAdapter:
        return CacheAdapter(self.cache.grown(capacity), self.cv)

    def copy(self, slots: int, capacity: int | None = None) -> CacheAdapter:
        return CacheAdapter(self.cache.copy(slots, capacity), self.cv)

    @property
    def nbytes(self) -> int:
        return int(self.cache.nbytes)

    def trim(self, n: int, n_layers: int | None = None) -> None:
        self.cache.trim(n, n_layers)

    def truncate(self, slots: int) -> None:
        self.cache.truncate(slots)

    def keys(self, end: int) -> np.ndarray:
        return self.cv.numpy(self.cache.keys(end))

    def layer_keys(self, layer: int, end: int) -> np.ndarray:
        return self.cv.numpy(self.cache.layer_keys(layer, end))


# (n_layers, n_kv_heads, head_dim, capacity, value_dim: None = head_dim) -> a backend's empty KV cache
# in the dtype under test
CacheFactory = Callable[[int, int, int, int, "int | None"], Any]


@forward_stages(lambda adapter, name: getattr(adapter.ops, name), H2OStageOps, ScoringStageOps)
class OpsAdapter(StageBoundary):
    """Every stage of both methods of one backend at one compute dtype, and its KV cache: the
    stages forwarded to `ops` (forward_stages), the layer, the reductions and the selection here."""

    def __init__(
        self,
        name: str,
        dtype: str,
        ops: ModelOps,
        convert: Convert,
        cache: CacheFactory,
        hybrid: Callable[[], Any] | None = None,
    ) -> None:
        self.name, self.dtype, self.ops, self.cv, self._cache = name, dtype, ops, convert, cache
        self._hybrid = hybrid  # () -> checks_hybrid_cache.HybridModel: the backend's tiny random hybrid

    def hybrid_model(self) -> Any:
        """The backend's tiny random hybrid in this dtype (conformance/checks_hybrid_cache.py), None: none."""
        return None if self._hybrid is None else self._hybrid()

    def new_cache(
        self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, value_dim: int | None = None
    ) -> CacheAdapter:
        return CacheAdapter(self._cache(n_layers, n_kv_heads, head_dim, capacity, value_dim), self.cv)

    def attention_layer(self, q, k, v, config: H2OConfig, scale, window=None, terms=None, prefix=0) -> H2OLayerResult:
        q, k, v = (self.stage_in("q", x) for x in (q, k, v))
        got = h2o_attention_layer(self.ops, q, k, v, config, scale, window, self.stage_in("terms", terms), prefix)
        return self.stage_out(got)

    def reduce_scores(self, probs, head_reduction, layer_reduction, lookahead_reduction="mean") -> np.ndarray:
        per_layer = self.ops.reduce_axis(self.cv.stats(probs), head_reduction, axis=2)
        return self.cv.numpy(
            self.ops.reduce_axis(self.ops.reduce_axis(per_layer, layer_reduction, axis=1), lookahead_reduction, axis=0)
        )

    def select_tokens(self, importance, config: SpecPrefillConfig) -> Selection:
        return select_tokens(self.cv.numpy(self.cv.stats(importance)), config)
