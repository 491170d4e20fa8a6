"""Static, preallocated KV cache addressed by slot.

A slot is where a token's keys/values live; its RoPE position is separate (already applied to the
keys). Tokens always fill slots in order: a step's `update_and_fetch` writes [offset, offset + T)
and returns slots [0, offset + T) (mlx-lm's interface, core/ops.py `LayerCache`). Speculative prefill stores its kept
tokens in slots 0..K-1 with their original positions and decodes from slot K.
"""

from __future__ import annotations

from typing import Any

import torch

from specfill.core.errors import PromptTooLongError
from specfill.core.models import ModelArgs
from specfill.core.ops import LayerBooks

from .rope import apply_rope, rotate_and_store


class LayerKVCache:
    """One layer's keys and values, [1, Hkv, capacity, D] each, and the RoPE position of every
    slot ([capacity] int64, shared by all layers; sliding-window layers read it)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor):
        self.k = keys
        self.v = values
        self.positions = positions
        self.offset = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def update_and_fetch(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [1, Hkv, T, D] (post-RoPE) in the next T slots; return every filled slot's
        keys and values [1, Hkv, offset + T, D] (views, no copies)."""
        start, end = self.offset, self.offset + k.shape[2]
        if end > self.capacity:
            raise PromptTooLongError(f"KV cache holds {self.capacity} tokens, writing slots {start}..{end - 1}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.offset = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def store_rotated(
        self, qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step's query and key heads qk [1, H + Hkv, T, D] before RoPE and its values v [1, Hkv, T, D]:
        rotated by the tables [T, D] (rope.apply_rope), the keys and values stored as update_and_fetch
        stores them; returns (the rotated queries [1, H, T, D], every filled slot's keys and values). On a
        GPU the rotation and both writes are one launch (rope.rotate_and_store)."""
        start, end = self.offset, self.offset + qk.shape[2]
        if end <= self.capacity:
            q = rotate_and_store(qk, v, cos, sin, n_heads, self.k, self.v, None, start)
            if q is not None:
                self.offset = end
                return q, self.k[:, :, :end], self.v[:, :, :end]
        qk = apply_rope(qk, cos, sin)
        keys, values = self.update_and_fetch(qk[:, n_heads:], v)
        return qk[:, :n_heads], keys, values

    def slot_positions(self, step_positions: torch.Tensor) -> torch.Tensor:
        """After a step's update_and_fetch: record its T positions [T] in its slots and return
        every filled slot's position [offset]."""
        self.positions[self.offset - step_positions.shape[0] : self.offset] = step_positions
        return self.positions[: self.offset]

    def trim(self, n: int) -> int:
        """Forget the last n filled slots; returns how many were dropped."""
        dropped = min(max(n, 0), self.offset)
        self.offset -= dropped
        return dropped


class ModelKVCache(LayerBooks[LayerKVCache]):
    """All layers' caches plus the number of slots filled so far (core/ops.py's KVCache).

    Every layer's keys (and values) are views into one [n_layers, 1, Hkv, capacity, D] tensor,
    so all layers' keys of a slot range are one strided view (speculator scoring reads them so).
    Values may have their own head dim Dv (latent attention; the conformance suite checks it):
    grown, copied and loaded caches keep it.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.k = keys
        self.v = values
        self.positions = torch.zeros(keys.shape[3], dtype=torch.int64, device=keys.device)
        self.layers = [LayerKVCache(k, v, self.positions) for k, v in zip(keys, values)]
        # decode steps captured over this cache's buffers (decode_graph.py): they live and die with it
        self.graphs: dict[tuple[Any, ...], Any] = {}
        self.graph_pool: Any = None  # their memory pool, this cache's own (decode_graph.CudaGraphCapture)

    @classmethod
    def allocate(cls, args: ModelArgs, capacity: int, dtype: torch.dtype, device: torch.device | str) -> "ModelKVCache":
        shape = (args.num_hidden_layers, 1, args.num_key_value_heads, capacity, args.head_dim)
        # Uninitialised: attention only ever reads slots below the ones just written.
        return cls(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def grown(self, capacity: int) -> ModelKVCache:
        """A new cache of `capacity` slots (same layers, heads, dtype, device) holding this one's
        filled slots: keys, values and positions."""
        return self._holding(self.filled, capacity)

    def _holding(self, slots: int, capacity: int) -> ModelKVCache:
        """A new cache of `capacity` slots holding this one's first `slots` slots (keys, values,
        positions); it shares no memory with this one."""
        held = ModelKVCache(
            self.k.new_empty(self._shape(self.k, capacity)), self.v.new_empty(self._shape(self.v, capacity))
        )
        held.k[:, :, :, :slots] = self.k[:, :, :, :slots]
        held.v[:, :, :, :slots] = self.v[:, :, :, :slots]
        held.positions[:slots] = self.positions[:slots]
        for layer in held.layers:
            layer.offset = slots
        return held

    @staticmethod
    def _shape(buffer: torch.Tensor, capacity: int) -> tuple[int, ...]:
        """A buffer's shape with `capacity` slots (keys' or values' own head dim)."""
        return tuple(buffer.shape[:3]) + (capacity,) + tuple(buffer.shape[4:])

    def keys(self, end: int) -> torch.Tensor:
        """Every layer's keys of slots [0, end): [n_layers, Hkv, end, D], a view."""
        return self.k[:, 0, :, :end]

    def layer_keys(self, layer: int, end: int) -> torch.Tensor:
        return self.k[layer, :, :, :end]  # [1, Hkv, end, D], a view

    @property
    def nbytes(self) -> int:
        """Bytes its buffers occupy (every reserved slot, filled or not, and the positions)."""
        return self.k.nbytes + self.v.nbytes + self.positions.nbytes

    def copy(self, slots: int, capacity: int | None = None) -> ModelKVCache:
        """A new cache holding this one's first `slots` slots (keys, values, positions) with room
        for `capacity` (at least `slots`); it shares no memory with this one."""
        if not 0 <= slots <= min(layer.offset for layer in self.layers):
            raise ValueError(f"cannot copy {slots} slots of a cache filled to {self.filled}")
        return self._holding(slots, max(slots, capacity or slots))

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        """Write the first `slots` slots to a safetensors file: keys and values [n_layers, Hkv,
        slots, D], positions [slots] (int64), and `metadata` in its header."""
        from safetensors.torch import save_file

        save_file(
            {
                "keys": self.k[:, 0, :, :slots].contiguous(),
                "values": self.v[:, 0, :, :slots].contiguous(),
                "positions": self.positions[:slots].contiguous(),
            },
            path,
            metadata=metadata,
        )

    def load(self, path: str) -> int:
        """Fill this empty cache from a file `save` wrote; returns its slots. ValueError when the
        file's layers, heads, head size or dtype are not this cache's, or it needs more room."""
        from safetensors.torch import load_file

        return self.fill(load_file(path, device=str(self.k.device)))

    def fill(self, tensors: dict[str, torch.Tensor]) -> int:
        """Fill this empty cache from a file's tensors "keys", "values", "positions" (others are
        not read); returns its slots. ValueError as `load`."""
        keys, values, positions = tensors["keys"], tensors["values"], tensors["positions"]
        slots = keys.shape[2]
        expected = (self.k.shape[0], self.k.shape[2], slots, self.k.shape[4])
        if (
            tuple(keys.shape) != expected
            or tuple(values.shape) != expected[:3] + (self.v.shape[4],)
            or keys.dtype != self.k.dtype
            or values.dtype != self.v.dtype
            or tuple(positions.shape) != (slots,)
            or slots > self.capacity
        ):
            raise ValueError(
                f"the file holds keys {tuple(keys.shape)} {keys.dtype}, this cache "
                f"{expected} {self.k.dtype} with {self.capacity} slots"
            )
        self.k[:, 0, :, :slots] = keys
        self.v[:, 0, :, :slots] = values
        self.positions[:slots] = positions
        for layer in self.layers:
            layer.offset = slots
        return slots
