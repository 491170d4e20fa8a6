"""The KV cache of a transformers hybrid: specfill's keys and values (cache.ModelKVCache) for the
attention layers, transformers' own per-layer linear-attention cache (`LinearAttentionLayer`: its
conv and recurrent / SSM states, updated through `Cache.update_conv_state` /
`update_recurrent_state`) for the others, in one transformers `Cache` the model's forward reads.

The books (snapshots, marks, truncate by replay, exact_prefix) are core/hybrid.py's. transformers
writes its states in place (`copy_`, the decode kernels' conv update), so a snapshot clones them
and a restore clones them back (a mark is restored more than once). The attention layers' entries
in transformers' Cache pass the step's keys and values through (`PassLayer`): specfill's attention
(adapter.py) stores them in its own cache; a layer with a mixer beside its attention (Falcon-H1's
"hybrid" kind) holds both (`PassLinearLayer`).

MiniMax-Text-01 (kind "lightning"): its lightning-attention layers keep their state (one K^T V
tensor per layer) in the model's own `MiniMaxCache.linear_cache`, which the model requires as its
cache class; `library` is then a MiniMaxCache holding the same per-layer entries (a lightning
layer's is a DummyLayer), its `linear_cache` the lightning layers' states (None: empty). The model
replaces that tensor at each step (no in-place write); a snapshot still clones it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionLayer

try:
    from transformers.cache_utils import DummyLayer
except ImportError:  # transformers before ~5.20 (5.17 on the GPU image) has none: the same no-op layer

    class DummyLayer:  # type: ignore[no-redef]
        """A layer slot holding no cache (transformers' DummyLayer, for versions without it)."""

        is_compileable = True
        is_croppable = True
        supports_early_init = False

        def __init__(self, **kwargs: Any) -> None:
            self.is_initialized = True
            self.keys = None
            self.values = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            if key_states is None and value_states is None:
                return None, None
            raise NotImplementedError("a layer without a cache cannot be updated")

        def offload(self) -> None: ...
        def prefetch(self) -> None: ...
        def reset(self) -> None: ...
        def crop(self, tokens_to_remove: int) -> None: ...
        def reorder_cache(self, beam_idx: Any) -> None: ...
        def batch_repeat_interleave(self, repeats: int) -> None: ...
        def batch_select_indices(self, indices: Any) -> None: ...

        def get_max_length(self) -> int:
            return -1


from specfill.core.hybrid import HybridBooks, Snapshot, step_positions
from specfill.core.io import hybrid_state

from .cache import LayerKVCache, ModelKVCache


class PassLayer(DynamicLayer):
    """transformers' cache entry of an attention layer run by specfill: keeps nothing, returns the
    step's keys and values (specfill's attention stores them). `books` gives the filled slot count."""

    def __init__(self, books: Any = None, **kwargs: Any):
        super().__init__()
        self.books = books

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0 if self.books is None else self.books.filled


class PassLinearLayer(LinearAttentionLayer):
    """A layer with a recurrent mixer beside its attention: transformers' states, keys passed through."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return query_length, 0


_STATE_FIELDS = ("conv_states", "recurrent_states")
_FLAG_FIELDS = ("is_conv_states_initialized", "is_recurrent_states_initialized", "has_previous_state")


def _lightning_cache(layers: list[Any]) -> Cache:
    """MiniMax's own cache class (its model refuses any other) over specfill's per-layer entries."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    cache = MiniMaxCache()
    cache.layers = layers
    cache.linear_cache = [None] * len(layers)
    return cache


def _clone(states: dict[int, torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
    return {i: None if t is None else t.clone() for i, t in states.items()}


class HybridKVCache(HybridBooks):
    """Every layer's cache: `library` transformers' Cache (PassLayer, LinearAttentionLayer,
    PassLinearLayer or DummyLayer per layer); `kv` specfill's ModelKVCache of the attention layers
    `attention` (model layer indices, in order); `recurrent` the layers with a linear-attention state."""

    def __init__(self, kinds: list[str], kv: ModelKVCache, number_of_states: list[int]):
        self.kinds = kinds
        self.kv = kv
        self.attention = [i for i, kind in enumerate(kinds) if kind in ("attention", "parallel")]
        self.recurrent = [i for i, kind in enumerate(kinds) if kind in ("recurrent", "parallel", "lightning")]
        self.number_of_states = number_of_states
        layers: list[Any] = []
        for kind, states in zip(kinds, number_of_states):
            if kind == "attention":
                layers.append(PassLayer(self))
            elif kind == "recurrent":
                layers.append(LinearAttentionLayer(number_of_states=states))
            elif kind == "parallel":
                layers.append(PassLinearLayer(number_of_states=states))
            else:
                layers.append(DummyLayer())
        self.library = _lightning_cache(layers) if "lightning" in kinds else Cache(layers=layers)
        self._slot = {layer: k for k, layer in enumerate(self.attention)}
        self._init_books()

    @classmethod
    def allocate(cls, kinds: list[str], states: list[int], args: Any, capacity: int, dtype: Any, device: Any):
        n_attention = sum(kind in ("attention", "parallel") for kind in kinds)
        shape = (n_attention, 1, args.num_key_value_heads, capacity, args.head_dim)
        kv = ModelKVCache(
            torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device)
        )
        return cls(kinds, kv, states)

    def layer_cache(self, layer: int) -> LayerKVCache:
        """Model layer `layer`'s LayerKVCache (an attention layer)."""
        return self.kv.layers[self._slot[layer]]

    def grown(self, capacity: int) -> HybridKVCache:
        self.kv = self.kv.grown(capacity)
        return self

    def keys(self, end: int) -> torch.Tensor:
        """The attention layers' keys [n_attention, Hkv, end, D] (the speculator scores from them)."""
        return self.kv.keys(end)

    def layer_keys(self, layer: int, end: int) -> torch.Tensor:
        """Model layer `layer`'s keys [1, Hkv, end, D] (an attention layer), no copy."""
        return self.kv.layer_keys(self._slot[layer], end)

    # the books' tensor work (core/hybrid.py)
    def _states(self) -> list[tuple]:
        out: list[tuple] = []
        for i in self.recurrent:
            if self.kinds[i] == "lightning":
                state = self.library.linear_cache[i]
                out.append(((_clone({0: state}),), "lightning"))
                continue
            layer = self.library.layers[i]
            tensors = tuple(_clone(getattr(layer, name)) for name in _STATE_FIELDS)
            flags = tuple(dict(getattr(layer, name)) for name in _FLAG_FIELDS)
            out.append((tensors, flags, dict(layer.conv_kernel_size), layer.dtype, layer.device))
        return out

    def _restore(self, snapshot: Snapshot) -> None:
        for i, (tensors, *rest) in zip(self.recurrent, snapshot.states):
            if self.kinds[i] == "lightning":
                self.library.linear_cache[i] = _clone(tensors[0])[0]
                continue
            flags, kernel, dtype, device = rest
            layer = self.library.layers[i]
            for name, states in zip(_STATE_FIELDS, tensors):
                setattr(layer, name, _clone(states))
            for name, values in zip(_FLAG_FIELDS, flags):
                setattr(layer, name, dict(values))
            layer.conv_kernel_size, layer.dtype, layer.device = dict(kernel), dtype, device

    def _tokens(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(pieces)

    def _positions(self, step: Snapshot) -> np.ndarray:
        positions = step.positions
        if isinstance(positions, torch.Tensor):
            positions = positions.detach().cpu().numpy()
        return step_positions(positions, self._count(step.ids))

    @property
    def state(self) -> list[torch.Tensor]:
        return [self.kv.k, self.kv.v]

    @property
    def nbytes(self) -> int:
        """The attention layers' buffers, the recurrent state and the snapshots' tensors."""
        total = self.kv.nbytes
        for states in [self._states()] + [s.states for s in self.marks + self.history]:
            for tensors, *_ in states:
                total += sum(t.nbytes for group in tensors for t in group.values() if t is not None)
        return total

    def copy(self, slots: int, capacity: int | None = None) -> HybridKVCache:
        """A new cache at the first `slots` slots, which must be `filled` or a snapshot's (exact_prefix)."""
        source = self.source_at(slots)
        copied = HybridKVCache(self.kinds, self.kv.copy(slots, capacity), self.number_of_states)
        copied._restore(source)
        copied.marks = [Snapshot(slots, copied._states())]
        copied.replay = self.replay
        return copied

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        """The attention layers' first `slots` slots and the recurrent state of the mark at `slots`
        (save_point) to a safetensors file, its layout in the metadata (core/io/hybrid_state.py)."""
        from safetensors.torch import save_file

        if "lightning" in self.kinds:  # its state is MiniMaxCache's own, not transformers' per-layer conv / SSM
            raise ValueError(
                "MiniMax's lightning-attention state is not written to disk: the conversation stays in memory"
            )
        mark = next((m for m in reversed(self.marks) if m.slots == slots), None)
        if mark is None or slots > self.filled:
            raise ValueError(f"a hybrid cache keeps no prompt-end mark at slot {slots} to write")
        members = [_members(state) for state in mark.states]
        tensors, layout = hybrid_state.pack(slots, self.attention, self.recurrent, members, _dtype_name)
        kv = {
            "keys": self.kv.k[:, 0, :, :slots].contiguous(),
            "values": self.kv.v[:, 0, :, :slots].contiguous(),
            "positions": self.kv.positions[:slots].contiguous(),
        }
        tensors = {name: t.contiguous() for name, t in tensors.items()}
        save_file({**kv, **tensors}, path, metadata={**metadata, hybrid_state.KEY: layout})

    def load(self, path: str) -> int:
        """Fill this empty cache from a file `save` wrote, standing at its mark; returns its slots.
        ValueError when its recurrent part is missing or does not fit this model's layers."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(path, device=str(self.kv.k.device))
        slots = tensors["keys"].shape[2] if "keys" in tensors else -1
        counts = [2 * self.number_of_states[i] for i in self.recurrent]
        states = hybrid_state.unpack(metadata, tensors, slots, self.attention, self.recurrent, counts, _dtype_name)
        slots = self.kv.fill({k: v for k, v in tensors.items() if not k.startswith(hybrid_state.PREFIX)})
        self._restore(Snapshot(slots, [_state(members) for members in states]))
        self.history, self.marks = [], [Snapshot(slots, self._states())]
        return slots


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).rsplit(".", 1)[-1]


def _members(state: tuple) -> list[torch.Tensor | None]:
    """A snapshot's layer state as the file's members (the module doc); ValueError where its flags
    do not follow from its tensors (then the file could not restore them)."""
    (conv, recurrent), (conv_set, recurrent_set, previous), kernel, *_ = state
    for i in conv:
        made = conv[i] is not None
        if (conv_set[i], previous[i], recurrent_set[i]) != (made, made, recurrent[i] is not None) or (
            made and kernel[i] != conv[i].shape[-1]
        ):
            raise ValueError(f"a recurrent layer's state {i} has flags its tensors do not give")
    return [conv[i] for i in sorted(conv)] + [recurrent[i] for i in sorted(recurrent)]


def _state(members: list[torch.Tensor | None]) -> tuple:
    """The file's members back as a snapshot's layer state (`_states`' form)."""
    n = len(members) // 2
    conv = {i: members[i] for i in range(n)}
    recurrent = {i: members[n + i] for i in range(n)}
    made = {i: conv[i] is not None for i in range(n)}
    flags = (made, {i: recurrent[i] is not None for i in range(n)}, dict(made))
    kernel = {i: None if conv[i] is None else int(conv[i].shape[-1]) for i in range(n)}
    first = next((t for t in conv.values() if t is not None), None)
    return (conv, recurrent), flags, kernel, getattr(first, "dtype", None), getattr(first, "device", None)
