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
                raise PromptTooLongError(f"KV cache holds {self.max_size} tokens, "
                                         f"writing slots {self.offset}..{needed - 1}")
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
        self.keys[..., self.offset:end, :] = keys
        self.values[..., self.offset:end, :] = values
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

    def make_mask(self, n_tokens: int, return_array: bool = False,
                  window_size: int | None = None) -> mx.array | str | None:
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
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class ModelKVCache:
    """Every layer's LayerKVCache (core/ops.py's KVCache): a sequence of them, one per layer, which
    is what the model's layers (and an adapted mlx-lm model's) take."""

    def __init__(self, layers: list[LayerKVCache]):
        self.layers = layers

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> LayerKVCache:
        return self.layers[index]

    def __iter__(self) -> Iterator[LayerKVCache]:
        return iter(self.layers)

    @property
    def filled(self) -> int:
        return self.layers[0].offset

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

    def trim(self, n: int, n_layers: int | None = None) -> None:
        for layer in self.layers[:n_layers]:
            layer.trim(n)

    def truncate(self, slots: int) -> None:
        for layer in self.layers:
            layer.trim(layer.offset - slots)

    def keys(self, end: int) -> mx.array:
        return mx.stack([layer.keys[0, :, :end] for layer in self.layers])

    @property
    def state(self) -> list[mx.array]:
        """Every layer's arrays, to evaluate after a step."""
        return [array for layer in self.layers for array in layer.state]

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


def make_cache(args: ModelArgs, capacity: int | None = None) -> ModelKVCache:
    """One cache per layer; `capacity` (slots) reserves the whole buffer on the first write."""
    return ModelKVCache([LayerKVCache(capacity) for _ in range(args.num_hidden_layers)])
