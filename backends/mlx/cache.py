"""Per-layer KV cache addressed by slot (batch 1).

A slot is where a token's keys/values live; the token's RoPE position is separate and already
applied to its keys. Tokens fill slots in order: a step appends at [offset, offset + T) and
attends to slots [0, offset + T). Speculative prefill stores its kept tokens in slots 0..K-1 at
their original positions and then decodes from slot K at position P (the prompt length).
"""

from __future__ import annotations

from typing import Iterator

import mlx.core as mx
import numpy as np

from specfill.core.errors import PromptTooLongError
from specfill.core.models import ModelArgs
from specfill.core.ops import LayerBooks


class LayerKVCache:
    """Keys and values [1, Hkv, capacity, D]; `offset` slots are filled."""

    step = 256  # growth granularity when no capacity was reserved

    def __init__(self, capacity: int | None = None):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.positions = np.zeros(0, np.int64)  # host copy of every filled slot's RoPE position
        self.offset = 0
        self.max_size = capacity  # None: grow without bound

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _reserve(self, needed: int, like_k: mx.array, like_v: mx.array) -> None:
        """Grow the buffers to hold `needed` slots (to max_size at once when it is known)."""
        if needed <= self.capacity:
            return
        if self.max_size is not None:
            if needed > self.max_size:
                raise PromptTooLongError(
                    f"KV cache holds {self.max_size} tokens, writing slots {self.offset}..{needed - 1}"
                )
            size = self.max_size
        else:
            size = (needed + self.step - 1) // self.step * self.step
        heads, pad = like_k.shape[1], size - self.offset
        new_k = mx.zeros((1, heads, pad, like_k.shape[-1]), like_k.dtype)
        new_v = mx.zeros((1, heads, pad, like_v.shape[-1]), like_v.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
        else:
            self.keys = mx.concatenate([self.keys[..., : self.offset, :], new_k], axis=2)
            self.values = mx.concatenate([self.values[..., : self.offset, :], new_v], axis=2)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Store post-RoPE keys/values [1, Hkv, T, D] in the next T slots; return all filled
        slots' keys and values [1, Hkv, offset + T, D]."""
        end = self.offset + keys.shape[2]
        self._reserve(end, keys, values)
        self.keys[..., self.offset : end, :] = keys
        self.values[..., self.offset : end, :] = values
        self.offset = end
        return self.keys[..., :end, :], self.values[..., :end, :]

    def slot_positions(self, step_positions: np.ndarray) -> np.ndarray:
        """After a step's update_and_fetch: record its T positions [T] in its slots and return
        every filled slot's position [offset] (sliding-window layers mask by them). On the host:
        deciding whether a window binds then never waits for the device."""
        start = self.offset - step_positions.shape[0]
        self.positions = np.concatenate([self.positions[:start], step_positions.astype(np.int64)])
        return self.positions

    def trim(self, n: int) -> int:
        """Forget the last n filled slots (their buffers are overwritten later); returns how many
        were dropped."""
        dropped = min(max(n, 0), self.offset)
        self.offset -= dropped
        return dropped

    def make_mask(
        self, n_tokens: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        """mlx-lm's mask for a step of n_tokens written at `offset` (slots = positions): what an
        mlx-lm attention module run as is (an adapted model's refused layer) reads. Bool
        [n_tokens, offset + n_tokens], "causal", or None (one token, no window)."""
        if window_size is None and not return_array:
            return None if n_tokens == 1 else "causal"
        rows = mx.arange(self.offset, self.offset + n_tokens)[:, None]
        cols = mx.arange(self.offset + n_tokens)[None]
        mask = rows >= cols
        return mask if window_size is None else mask & (rows < cols + window_size)

    @property
    def state(self) -> list[mx.array]:
        """The arrays to evaluate after a step (mx.eval(cache.state))."""
        return [] if self.keys is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        """Bytes its buffers occupy (every reserved slot, filled or not, and the host positions)."""
        return self.positions.nbytes + (0 if self.keys is None else self.keys.nbytes + self.values.nbytes)


class SharedLayerKVCache:
    """A KV-shared layer's entry (Gemma 4's has_kv False): the source layer's LayerKVCache read
    through, never written or trimmed on its own (the source's trim is this layer's); it holds no
    buffers of its own, so it adds no bytes and no arrays to evaluate."""

    def __init__(self, source: LayerKVCache, index: int):
        self.source, self.index = source, index

    keys = property(lambda self: self.source.keys)
    values = property(lambda self: self.source.values)
    positions = property(lambda self: self.source.positions)
    offset = property(lambda self: self.source.offset)
    state: list[mx.array] = []
    nbytes = 0

    @property
    def max_size(self) -> int | None:
        return self.source.max_size

    @max_size.setter
    def max_size(self, capacity: int | None) -> None:
        """The source's bound is set through its own entry."""

    def trim(self, n: int) -> int:
        """Nothing of its own to forget: the source layer's trim covers these slots."""
        return min(max(n, 0), self.offset)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        raise ValueError(f"a KV-shared layer does not write: it reads layer {self.index}'s cache")


class ModelKVCache(LayerBooks[LayerKVCache | SharedLayerKVCache]):
    """Every layer's LayerKVCache (core/ops.py's KVCache): a sequence of them, one per layer, which
    is what the model's layers (and an adapted mlx-lm model's) take."""

    def __init__(self, layers: list[LayerKVCache | SharedLayerKVCache]):
        self.layers = layers

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> LayerKVCache:
        return self.layers[index]

    def __iter__(self) -> Iterator[LayerKVCache]:
        return iter(self.layers)

    @property
    def capacity(self) -> int:
        """The reserved size; unbounded (2**62) for a cache made without one."""
        size = self.layers[0].max_size
        return size if size is not None else 1 << 62

    def grown(self, capacity: int) -> ModelKVCache:
        """Itself: MLX caches grow their buffers themselves, up to the new max_size."""
        for layer in self.layers:
            layer.max_size = capacity
        return self

    def keys(self, end: int) -> mx.array:
        return mx.stack([layer.keys[0, :, :end] for layer in self.layers])  # a copy once evaluated

    def layer_keys(self, layer: int, end: int) -> mx.array:
        return self.layers[layer].keys[:, :, :end]  # a slice of the layer's buffer, not a stack of every layer

    @property
    def state(self) -> list[mx.array]:
        """Every layer's arrays, to evaluate after a step."""
        return [array for layer in self.layers for array in layer.state]

    @property
    def nbytes(self) -> int:
        """Bytes its buffers occupy (every reserved slot, filled or not)."""
        return sum(layer.nbytes for layer in self.layers)

    def copy(self, slots: int, capacity: int | None = None) -> ModelKVCache:
        """A new cache holding this one's first `slots` slots (keys, values, positions), its buffers
        exactly that long (they grow on the next write, up to `capacity`, or this one's bound); it
        shares no memory with this one (evaluated here)."""
        if not 0 <= slots <= min(layer.offset for layer in self.layers):
            raise ValueError(f"cannot copy {slots} slots of a cache filled to {self.filled}")
        layers: list = []
        for layer in self.layers:
            if isinstance(layer, SharedLayerKVCache):  # shared again, with the copy of its source
                layers.append(SharedLayerKVCache(layers[layer.index], layer.index))
                continue
            bound = layer.max_size if capacity is None else max(slots, capacity)
            copied = LayerKVCache(bound)
            if slots and layer.keys is not None:
                copied.keys = mx.contiguous(layer.keys[..., :slots, :])
                copied.values = mx.contiguous(layer.values[..., :slots, :])
            copied.positions, copied.offset = layer.positions[:slots].copy(), slots
            layers.append(copied)
        result = ModelKVCache(layers)
        mx.eval(result.state)
        return result

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        """Write the first `slots` slots to a safetensors file (`path` ends in .safetensors): `arrays`
        and `metadata` in its header."""
        mx.save_safetensors(path, self.arrays(slots), metadata=metadata)

    def arrays(self, slots: int) -> dict[str, mx.array]:
        """What `save` writes: keys and values [n_layers, Hkv, slots, D], positions [slots] (int64: the
        sliding-window layers' record, every layer's alike; slot numbers when no layer has one). Layers
        whose keys or values differ in shape (Gemma 4's wider full-attention heads) are written one per
        layer instead: "keys.i" and "values.i" [Hkv_i, slots, D_i]."""
        recorded = [layer.positions for layer in self.layers if len(layer.positions) >= slots]
        positions = recorded[0][:slots] if recorded else np.arange(slots)  # unread: no sliding-window layer
        keys = [layer.keys[0, :, :slots] for layer in self.layers]
        values = [layer.values[0, :, :slots] for layer in self.layers]
        arrays = {"positions": mx.array(positions.astype(np.int64))}
        if len({(k.shape, v.shape) for k, v in zip(keys, values)}) == 1:
            arrays.update(keys=mx.stack(keys), values=mx.stack(values))
        else:
            arrays.update(
                {f"{name}.{i}": a for name, per in (("keys", keys), ("values", values)) for i, a in enumerate(per)}
            )
        return arrays

    def load(self, path: str) -> int:
        """Fill this empty cache from a file `save` wrote; returns its slots. ValueError when the
        file's layers or positions do not fit this cache or it needs more room (its heads, head size
        and dtype are the file's: the caller checks them against the model)."""
        return self.fill(mx.load(path))

    def fill(self, arrays: dict[str, mx.array]) -> int:
        """`load` from a file's arrays (the names `arrays` gives); returns the slots read."""
        positions = np.asarray(arrays["positions"])
        if "keys" in arrays:
            keys, values = arrays["keys"], arrays["values"]
            if keys.ndim != 4 or values.ndim != 4:
                raise ValueError(f"the file holds keys {tuple(keys.shape)}, not [layers, heads, slots, dim]")
        else:  # one array per layer (layers of different shapes)
            per_layer = [(arrays.get(f"keys.{i}"), arrays.get(f"values.{i}")) for i in range(len(self.layers))]
            if any(k is None or v is None or k.ndim != 3 for k, v in per_layer):
                raise ValueError(
                    f"the file holds no keys and values for each of this cache's {len(self.layers)} layers"
                )
            keys, values = [k for k, _ in per_layer], [v for _, v in per_layer]
        slots = keys[0].shape[1]
        if (
            len(keys) != len(self.layers)
            or any(k.ndim != 3 or k.shape[1] != slots or v.shape[:2] != k.shape[:2] for k, v in zip(keys, values))
            or positions.shape != (slots,)
            or slots > self.capacity
        ):
            raise ValueError(
                f"the file holds keys {[tuple(k.shape) for k in keys]}, this cache {len(self.layers)} layers "
                f"of {self.capacity} slots"
            )
        for i, layer in enumerate(self.layers):
            if isinstance(layer, SharedLayerKVCache):  # its source's entry fills it
                continue
            layer.update_and_fetch(keys[i][None], values[i][None])
            layer.positions = positions.astype(np.int64)
        mx.eval(self.state)
        return slots


def make_cache(args: ModelArgs, capacity: int | None = None) -> ModelKVCache:
    """One cache per layer; `capacity` (slots) reserves the whole buffer on the first write."""
    return ModelKVCache([LayerKVCache(capacity) for _ in range(args.num_hidden_layers)])
