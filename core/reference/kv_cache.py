"""The KV cache as the executable spec (core/ops.py's KVCache and LayerCache), on NumPy arrays.

The conformance suite drives a backend's cache and this one through the same writes, trims, cuts
and growth and compares what each holds (conformance/checks_kv_cache.py). A slot is where a token's
keys and values live; slots fill in order from `offset`; every layer fills the same slots except
where a draft wrote into the first layers only or a prefill stopped between layers.
"""

from __future__ import annotations

import numpy as np

from ..errors import PromptTooLongError
from ..ops import LayerBooks


class ReferenceLayerCache:
    """One layer: keys [1, Hkv, capacity, D] and values [1, Hkv, capacity, Dv]; `offset` slots are filled."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, offset: int = 0) -> None:
        self.k, self.v, self.offset = keys, values, offset

    def update_and_fetch(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store keys [1, Hkv, T, D] / values [1, Hkv, T, Dv] in the next T slots; return every filled slot's."""
        end = self.offset + keys.shape[2]
        if end > self.k.shape[2]:
            raise PromptTooLongError(f"KV cache holds {self.k.shape[2]} tokens, writing slots {self.offset}..{end - 1}")
        self.k[:, :, self.offset : end], self.v[:, :, self.offset : end] = keys, values
        self.offset = end
        return self.k[:, :, :end].copy(), self.v[:, :, :end].copy()

    def trim(self, n: int) -> int:
        """Forget the last n filled slots (at most all of them); returns how many were dropped."""
        dropped = min(max(n, 0), self.offset)
        self.offset -= dropped
        return dropped


class ReferenceKVCache(LayerBooks[ReferenceLayerCache]):
    """Every layer's cache, `capacity` slots each. value_dim: the values' head dim where it is not
    the keys' (latent attention: keys of qk_nope + qk_rope dims, values of v_head_dim); None: head_dim."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: np.dtype | str = np.float64,
        value_dim: int | None = None,
    ) -> None:
        shape = (1, n_kv_heads, capacity, head_dim)
        value_shape = (1, n_kv_heads, capacity, head_dim if value_dim is None else value_dim)
        self.layers = [
            ReferenceLayerCache(np.zeros(shape, dtype), np.zeros(value_shape, dtype)) for _ in range(n_layers)
        ]

    def _empty(self, capacity: int) -> ReferenceKVCache:
        """A cache of this one's layers, shapes and dtype with `capacity` slots."""
        _, heads, _, head_dim = self.layers[0].k.shape
        value_dim = self.layers[0].v.shape[3]
        return ReferenceKVCache(len(self.layers), heads, head_dim, capacity, self.layers[0].k.dtype, value_dim)

    @property
    def capacity(self) -> int:
        return self.layers[0].k.shape[2]

    def grown(self, capacity: int) -> ReferenceKVCache:
        """A cache of `capacity` slots holding these filled slots (each layer's own)."""
        grown = self._empty(capacity)
        for old, new in zip(self.layers, grown.layers):
            new.k[:, :, : old.offset], new.v[:, :, : old.offset] = old.k[:, :, : old.offset], old.v[:, :, : old.offset]
            new.offset = old.offset
        return grown

    def keys(self, end: int) -> np.ndarray:
        """Every layer's keys of slots [0, end): [n_layers, Hkv, end, D]."""
        return np.stack([layer.k[0, :, :end] for layer in self.layers])

    def layer_keys(self, layer: int, end: int) -> np.ndarray:
        """One layer's keys of slots [0, end): [1, Hkv, end, D], a view."""
        return self.layers[layer].k[:, :, :end]

    @property
    def nbytes(self) -> int:
        """Bytes its buffers occupy (every reserved slot, filled or not)."""
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)

    def copy(self, slots: int, capacity: int | None = None) -> ReferenceKVCache:
        """A new cache of max(slots, capacity) slots holding the first `slots` of every layer; it
        shares no memory with this one."""
        if not 0 <= slots <= min(layer.offset for layer in self.layers):
            raise ValueError(f"cannot copy {slots} slots of a cache filled to {self.filled}")
        copied = self._empty(max(slots, capacity or slots))
        for old, new in zip(self.layers, copied.layers):
            new.k[:, :, :slots], new.v[:, :, :slots] = old.k[:, :, :slots], old.v[:, :, :slots]
            new.offset = slots
        return copied

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        """Write the first `slots` slots to a safetensors file: keys [n_layers, Hkv, slots, D], values
        [.., Dv] and `metadata` in its header (no positions: slot i is position i here)."""
        from safetensors.numpy import save_file

        save_file(
            {"keys": self.keys(slots), "values": np.stack([layer.v[0, :, :slots] for layer in self.layers])},
            path,
            metadata=metadata,
        )

    def load(self, path: str) -> int:
        """Fill this empty cache from a file `save` wrote; returns its slots (ValueError when its
        shape or dtype is not this cache's)."""
        from safetensors.numpy import load_file

        arrays = load_file(path)
        keys, values = arrays["keys"], arrays["values"]
        _, heads, capacity, head_dim = self.layers[0].k.shape
        slots = keys.shape[2]
        if (
            keys.shape != (len(self.layers), heads, slots, head_dim)
            or values.shape != (len(self.layers), heads, slots, self.layers[0].v.shape[3])
            or keys.dtype != self.layers[0].k.dtype
            or slots > capacity
        ):
            raise ValueError(
                f"the file holds keys {keys.shape} {keys.dtype}, this cache "
                f"{(len(self.layers), heads, capacity, head_dim)} {self.layers[0].k.dtype}"
            )
        for i, layer in enumerate(self.layers):
            layer.k[0, :, :slots], layer.v[0, :, :slots], layer.offset = keys[i], values[i], slots
        return slots
