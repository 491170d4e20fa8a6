"""One conformance adapter for every backend: its ops (core/ops.py) behind NumPy in, NumPy out.

Inputs arrive as float64 NumPy arrays already rounded to the dtype under test; `Convert` turns them
into the backend's arrays (compute dtype for q/k/v/o, the statistics dtype for m, l, scores and
probabilities, integers for memory sets) and results back into NumPy. `attention_layer` runs the
one walk of core/methods/h2o.py over the backend's ops; selection runs on the host for every
backend (core/reference/specprefill.py), from the importance computed in the statistics dtype.
`new_cache` makes the backend's KV cache (core/ops.py's KVCache) behind the same boundary
(`CacheAdapter`), for the cache's checks against core/reference/kv_cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.methods.h2o import h2o_attention_layer
from specfill.core.ops import ModelOps
from specfill.core.reference.specprefill import select_tokens
from specfill.core.stages import (
    AttentionState,
    AttentionTerms,
    H2OLayerResult,
    InterResult,
    IntraResult,
    KeyWindow,
    MemorySet,
    Selection,
    active_terms,
)


@dataclass(frozen=True)
class Convert:
    """NumPy <-> a backend's arrays: native (compute dtype), stats (statistics dtype), index
    (memory-set positions) and numpy (back; float16 / bfloat16 widened to float32)."""

    native: Callable[[np.ndarray], Any]
    stats: Callable[[np.ndarray], Any]
    index: Callable[[np.ndarray], Any]
    numpy: Callable[[Any], np.ndarray]


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


class OpsAdapter:
    """Every stage of both methods of one backend at one compute dtype, and its KV cache."""

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

    def _state(self, s: AttentionState) -> AttentionState:
        return AttentionState(self.cv.numpy(s.m), self.cv.numpy(s.l), self.cv.numpy(s.o))

    def _state_in(self, s: AttentionState) -> AttentionState:
        return AttentionState(self.cv.stats(s.m), self.cv.stats(s.l), self.cv.native(s.o))

    def _memory(self, memory: MemorySet | None) -> MemorySet | None:
        return None if memory is None else MemorySet(self.cv.index(np.asarray(memory.indices)), memory.chunk_index)

    def _terms(self, terms: AttentionTerms | None) -> tuple:
        """The stages' trailing terms argument on the backend's arrays (sinks in the statistics
        dtype), or nothing at all without terms: a call without terms is today's call."""
        terms = active_terms(terms)
        if terms is None:
            return ()
        sinks = None if terms.sinks is None else self.cv.stats(np.asarray(terms.sinks))
        return (AttentionTerms(sinks, terms.softcap),)

    def _memory_out(self, memory: MemorySet) -> MemorySet:
        return MemorySet(self.cv.numpy(memory.indices).astype(np.int64), memory.chunk_index)

    # H2O stages
    def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None) -> IntraResult:
        got = self.ops.intra_attention(
            self.cv.native(q), self.cv.native(k), self.cv.native(v), chunk_size, scale, window, *self._terms(terms)
        )
        return IntraResult(self._state(got.state), self.cv.numpy(got.colsum))

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads) -> np.ndarray:
        return self.cv.numpy(self.ops.reduce_colsum_to_kv_heads(self.cv.stats(colsum), n_kv_heads))

    def accumulate_scores(self, scores, memory, kv_colsum) -> np.ndarray:
        got = self.ops.accumulate_scores(self.cv.stats(scores), self._memory(memory), self.cv.stats(kv_colsum))
        return self.cv.numpy(got)

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy) -> MemorySet:
        return self._memory_out(
            self.ops.build_memory_set(
                self.cv.stats(scores), self._memory(previous), chunk_index, chunk_start, chunk_end, local, heavy
            )
        )

    def gather_memory(self, k, v, memory) -> tuple[np.ndarray, np.ndarray]:
        k_mem, v_mem = self.ops.gather_memory(self.cv.native(k), self.cv.native(v), self._memory(memory))
        return self.cv.numpy(k_mem), self.cv.numpy(v_mem)

    def inter_attention(self, q, k_mem, v_mem, scale, window: KeyWindow | None = None, terms=None) -> InterResult:
        if window is not None and window.key_positions is not None:
            window = replace(window, key_positions=self.cv.index(np.asarray(window.key_positions)))
        got = self.ops.inter_attention(
            self.cv.native(q), self.cv.native(k_mem), self.cv.native(v_mem), scale, window, *self._terms(terms)
        )
        return InterResult(self._state(got.state), self.cv.numpy(got.colsum))

    def merge_states(self, a, b) -> AttentionState:
        return self._state(self.ops.merge_states(self._state_in(a), self._state_in(b)))

    def add_sinks(self, state, sinks) -> AttentionState:
        return self._state(self.ops.add_sinks(self._state_in(state), self.cv.stats(np.asarray(sinks))))

    def attention_layer(self, q, k, v, config: H2OConfig, scale, window=None, terms=None) -> H2OLayerResult:
        return self.attention_layer_from_prefix(q, k, v, 0, config, scale, window, terms)

    def attention_layer_from_prefix(
        self, q, k, v, prefix: int, config: H2OConfig, scale, window=None, terms=None
    ) -> H2OLayerResult:
        terms = self._terms(terms)
        got = h2o_attention_layer(
            self.ops,
            self.cv.native(q),
            self.cv.native(k),
            self.cv.native(v),
            config,
            scale,
            window,
            terms[0] if terms else None,
            prefix,
        )
        return H2OLayerResult(
            self.cv.numpy(got.output), self.cv.numpy(got.scores), [self._memory_out(m) for m in got.memory_sets]
        )

    # speculative-prefill stages
    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None) -> np.ndarray:
        return self.cv.numpy(
            self.ops.attention_scores(
                self.cv.native(queries),
                self.cv.native(keys),
                scale,
                window,
                *self._terms(terms),
                query_start=query_start,
            )
        )

    def smooth_scores(self, probs, kernel) -> np.ndarray:
        return self.cv.numpy(self.ops.smooth_scores(self.cv.stats(probs), kernel))

    def reduce_scores(self, probs, head_reduction, layer_reduction, lookahead_reduction="mean") -> np.ndarray:
        per_layer = self.ops.reduce_axis(self.cv.stats(probs), head_reduction, axis=2)
        return self.cv.numpy(
            self.ops.reduce_axis(self.ops.reduce_axis(per_layer, layer_reduction, axis=1), lookahead_reduction, axis=0)
        )

    def select_tokens(self, importance, config: SpecPrefillConfig) -> Selection:
        return select_tokens(self.cv.numpy(self.cv.stats(importance)), config)
