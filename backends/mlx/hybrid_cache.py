"""The KV cache of a hybrid model: specfill's keys and values for the attention layers, the
library's own recurrent state (mlx-lm's ArraysCache: conv + SSM / delta-rule state) for the others.

The books (step snapshots, prompt-end marks, truncate by snapshot + replay, exact_prefix) are
core/hybrid.py's, shared with the torch backend; here is the tensor work. MLX arrays are never
written in place, so a snapshot is a list of references (no copy).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import mlx.core as mx
import numpy as np

from specfill.core.hybrid import HISTORY, MARKS, HybridBooks, Snapshot, step_positions
from specfill.core.io import hybrid_state

from .cache import LayerKVCache, ModelKVCache

__all__ = ["HISTORY", "MARKS", "HybridKVCache", "Snapshot"]


class HybridKVCache(HybridBooks):
    """Every layer's cache (see the module doc): `per_layer[i]` is a LayerKVCache, the library's
    recurrent cache, both in mlx-lm's CacheList (Falcon-H1's parallel layers) or None (a layer that
    keeps nothing: Nemotron-H's MLP blocks); make_recurrent(i): mlx-lm's fresh cache of layer i; `layers` the
    attention layers' LayerKVCaches (what the methods read);
    replay(model, ids, positions, cache): runs a step on the cache (adapted.py's, set by each step)."""

    def __init__(self, per_layer: list[Any], make_recurrent: Callable[[int], Any]):
        self.per_layer = per_layer
        self.attention = [i for i, c in enumerate(per_layer) if _kv_of(c) is not None]
        self.recurrent = [i for i, c in enumerate(per_layer) if _state_of(c) is not None]
        self.make_recurrent = make_recurrent
        self.kv = ModelKVCache([_kv_of(per_layer[i]) for i in self.attention])
        self._init_books()

    # the model's view: one cache object per layer
    def __len__(self) -> int:
        return len(self.per_layer)

    def __getitem__(self, index: int) -> Any:
        return self.per_layer[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.per_layer)

    def grown(self, capacity: int) -> HybridKVCache:
        self.kv.grown(capacity)
        return self

    def keys(self, end: int) -> mx.array:
        """The attention layers' keys [n_attention, Hkv, end, D] (the speculator scores from them)."""
        return self.kv.keys(end)

    def layer_keys(self, layer: int, end: int) -> mx.array:
        """Model layer `layer`'s keys [1, Hkv, end, D] (an attention layer), no copy."""
        return self.kv.layer_keys(self.attention.index(layer), end)

    def _states(self) -> list[list[Any]]:
        return [list(_state_of(self.per_layer[i]).cache) for i in self.recurrent]

    def _restore(self, snapshot: Snapshot) -> None:
        """The snapshot's recurrent arrays back in the layers' own cache objects."""
        for i, state in zip(self.recurrent, snapshot.states):
            _state_of(self.per_layer[i]).cache = list(state)

    def _tokens(self, pieces: list[mx.array]) -> mx.array:
        return mx.concatenate(pieces)

    def _positions(self, step: Snapshot) -> np.ndarray:
        return step_positions(step.positions, self._count(step.ids))

    @property
    def state(self) -> list[mx.array]:
        arrays = [a for i in self.recurrent for a in _state_of(self.per_layer[i]).cache if a is not None]
        return self.kv.state + arrays

    @property
    def nbytes(self) -> int:
        """The attention layers' buffers, the recurrent state and the snapshots' arrays."""
        seen, total = set(), self.kv.nbytes
        for states in [self._states()] + [s.states for s in self.marks + self.history]:
            for array in (a for layer in states for a in layer if a is not None):
                if id(array) not in seen:
                    seen.add(id(array))
                    total += array.nbytes
        return total

    def copy(self, slots: int, capacity: int | None = None) -> HybridKVCache:
        """A new cache at the first `slots` slots, which must be `filled` or a snapshot's (exact_prefix)."""
        source = self.source_at(slots)
        kv = self.kv.copy(slots, capacity)
        copied_kv = dict(zip(self.attention, kv.layers))
        per_layer = [
            _rebuilt(entry, copied_kv.get(i), self.make_recurrent(i) if i in self.recurrent else None)
            for i, entry in enumerate(self.per_layer)
        ]
        copied = HybridKVCache(per_layer, self.make_recurrent)
        copied._restore(source)
        copied.marks = [Snapshot(slots, copied._states())]
        copied.replay = self.replay
        return copied

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        """The attention layers' first `slots` slots and the recurrent state of the mark at `slots`
        (save_point) to a safetensors file, with its layout in the metadata (core/io/hybrid_state.py)."""
        mark = next((m for m in reversed(self.marks) if m.slots == slots), None)
        if mark is None or slots > self.filled:
            raise ValueError(f"a hybrid cache keeps no prompt-end mark at slot {slots} to write")
        tensors, layout = hybrid_state.pack(slots, self.attention, self.recurrent, mark.states, _dtype_name)
        mx.save_safetensors(path, {**self.kv.arrays(slots), **tensors}, metadata={**metadata, hybrid_state.KEY: layout})

    def load(self, path: str) -> int:
        """Fill this empty cache from a file `save` wrote, standing at its mark; returns its slots.
        ValueError when its recurrent part is missing or does not fit this model's layers."""
        arrays, metadata = mx.load(path, return_metadata=True)
        members = [len(_state_of(self.per_layer[i]).cache) for i in self.recurrent]
        slots = arrays["keys"].shape[2] if "keys" in arrays else -1
        states = hybrid_state.unpack(metadata, arrays, slots, self.attention, self.recurrent, members, _dtype_name)
        slots = self.kv.fill({k: v for k, v in arrays.items() if not k.startswith(hybrid_state.PREFIX)})
        self._restore(Snapshot(slots, states))
        self.history, self.marks = [], [Snapshot(slots, self._states())]
        mx.eval(self.state)
        return slots


def _dtype_name(array: mx.array) -> str:
    return str(array.dtype).rsplit(".", 1)[-1]


def _members(entry: Any) -> tuple[Any, ...]:
    """A layer's cache objects: mlx-lm's CacheList holds several (Falcon-H1: Mamba's and the attention's)."""
    return () if entry is None else tuple(entry.caches) if hasattr(entry, "caches") else (entry,)


def _kv_of(entry: Any) -> LayerKVCache | None:
    return next((c for c in _members(entry) if isinstance(c, LayerKVCache)), None)


def _state_of(entry: Any) -> Any:
    """The layer's recurrent cache (mlx-lm's ArraysCache), None for an attention-only layer."""
    return next((c for c in _members(entry) if not isinstance(c, LayerKVCache)), None)


def _rebuilt(entry: Any, kv: LayerKVCache | None, library: Any) -> Any:
    """A layer's entry for a copy: `kv` for its LayerKVCache, the recurrent member of `library`
    (mlx-lm's fresh cache for the layer) for its recurrent cache, in the entry's own form."""
    if entry is None or isinstance(entry, LayerKVCache):
        return None if entry is None else kv
    fresh = _state_of(library)
    if not hasattr(entry, "caches"):
        return fresh
    return type(entry)(*(kv if isinstance(c, LayerKVCache) else fresh for c in entry.caches))
