"""The KV cache of a hybrid model: specfill's keys and values for the attention layers, the
library's own recurrent state (mlx-lm's ArraysCache: conv + SSM / delta-rule state) for the others.

One object with its own books (core/ops.py's KVCache): `filled` counts the slots every layer has
read (an attention layer's offset; a recurrent layer has read the same tokens, in order). What a
recurrent state cannot do is forget its last tokens, so the cache keeps what it needs to go back:

- a step snapshot before every forward step (the recurrent arrays as they were: MLX arrays are
  never written in place, so a snapshot is a list of references), with that step's tokens and
  positions and the model (view) that ran it, the last HISTORY steps;
- marks: the recurrent state at the end of a prompt (`mark`, called by the driver after each
  prefill), the last MARKS of them, for the prompt cache's reuse of an earlier turn.

`trim` / `truncate` to slot s: from a mark at s, or else from the latest step snapshot at or below
s, then the tokens between that snapshot and s are run again (the replay: a rejected draft rolls
the recurrent state back by recomputing the accepted tokens). A slot count that no snapshot
reaches is refused (ValueError); `exact_prefix` tells the prompt cache which prefixes it can give.
A step stopped between layers (a cancelled request) is undone on every layer before the cache is
used again (`open` until the step ends).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import mlx.core as mx
import numpy as np

from specfill.core.io import hybrid_state

from .cache import LayerKVCache, ModelKVCache

HISTORY = 32  # step snapshots kept: a drafting round's draft steps and its verification fit
MARKS = 2  # prompt-end snapshots kept: the last turn's (reused) and the one before


class Snapshot:
    """The recurrent layers' arrays at `slots` filled slots (and the step that followed, if any)."""

    def __init__(self, slots: int, states: list[list[Any]], ids: Any = None, positions: Any = None, model: Any = None):
        self.slots, self.states, self.ids, self.positions, self.model = slots, states, ids, positions, model


class HybridKVCache:
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
        self.history: list[Snapshot] = []
        self.marks: list[Snapshot] = []
        self.replay: Callable[[Any, Any, Any, HybridKVCache], Any] | None = None
        self.open = False  # a step has begun and not ended

    # the model's view: one cache object per layer
    def __len__(self) -> int:
        return len(self.per_layer)

    def __getitem__(self, index: int) -> Any:
        return self.per_layer[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.per_layer)

    @property
    def layers(self) -> list[LayerKVCache]:
        return self.kv.layers

    @property
    def filled(self) -> int:
        return self.kv.filled

    @property
    def capacity(self) -> int:
        return self.kv.capacity

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

    def begin_step(self, model: Any, ids: mx.array, positions: int | np.ndarray) -> None:
        """Before a forward step of `model` (the whole model or a first-layers view): its snapshot."""
        self._interrupted()  # a step that never finished: back to before it first
        self.history.append(Snapshot(self.filled, self._states(), ids, positions, model))
        del self.history[:-HISTORY]
        self.open = True

    def end_step(self) -> None:
        """The step begun last ran through every layer."""
        self.open = False

    def _interrupted(self) -> None:
        """After a step stopped between layers (a cancelled request: some layers read its tokens,
        others not), restore the snapshot before it on every layer."""
        if self.open:
            self.open = False
            base = self.history.pop()
            self._restore(base)
            self.kv.truncate(base.slots)

    def mark(self) -> None:
        """Keep the recurrent state at the current slot count (the end of a prompt)."""
        self.marks = [m for m in self.marks if m.slots != self.filled][-(MARKS - 1) :]
        self.marks.append(Snapshot(self.filled, self._states()))

    def exact_prefix(self, slots: int) -> int:
        """The longest prefix of at most `slots` slots this cache can stand at exactly: `filled`,
        a mark, or a step snapshot (recurrent state cannot be cut between them). A step stopped
        between layers is undone first."""
        self._interrupted()
        points = [self.filled] + [s.slots for s in self.marks + self.history]
        return max((p for p in points if p <= slots), default=0)

    def _snapshot_at(self, slots: int) -> Snapshot | None:
        return next((s for s in reversed(self.marks + self.history) if s.slots == slots), None)

    def truncate(self, slots: int) -> None:
        """Back to the first `slots` slots (see the module doc); ValueError when no snapshot reaches them."""
        self._interrupted()
        if slots >= self.filled:
            return
        mark = next((m for m in reversed(self.marks) if m.slots == slots), None)
        if mark is not None:  # (a step snapshot at `slots` is the base below: nothing to replay)
            self._restore(mark)
            self.kv.truncate(slots)
            self.history = [s for s in self.history if s.slots <= slots]
            return
        base = next((s for s in reversed(self.history) if s.slots <= slots), None)
        if base is None or (slots > base.slots and self.replay is None):
            raise ValueError(
                f"a hybrid cache filled to {self.filled} slots cannot go back to {slots}: "
                f"its recurrent layers keep no state there"
            )
        later = [s for s in self.history if s.slots >= base.slots]
        self._restore(base)
        self.kv.truncate(base.slots)
        self.history = [s for s in self.history if s.slots < base.slots]
        self.marks = [m for m in self.marks if m.slots <= slots]
        if slots > base.slots:  # run the kept tokens again, as the steps that wrote them did
            ends = [s.slots for s in later[1:]] + [None]
            ids = mx.concatenate([s.ids[: None if e is None else e - s.slots] for s, e in zip(later, ends)])
            positions = np.concatenate(
                [_positions(s)[: None if e is None else e - s.slots] for s, e in zip(later, ends)]
            )[: slots - base.slots]
            start = int(positions[0])
            consecutive = np.array_equal(positions, np.arange(start, start + len(positions)))
            self.replay(base.model, ids[: slots - base.slots], start if consecutive else positions, self)

    def trim(self, n: int, n_layers: int | None = None) -> None:
        """Drop the last n slots; with n_layers, a first-layers view's last n tokens (a "self:K"
        draft's writes, its last steps): the snapshot before them comes back (the later layers'
        recurrent state in it is theirs now: the view did not run them)."""
        self._interrupted()
        if n <= 0:
            return
        if n_layers is None:
            self.truncate(self.filled - n)
            return
        steps, count = 0, 0
        while count < n and steps < len(self.history):
            steps += 1
            count += self.history[-steps].ids.shape[0]
        if count != n:
            raise ValueError(f"a hybrid cache's last steps do not hold the view's {n} tokens exactly")
        self._restore(self.history[-steps])
        del self.history[-steps:]
        for index, layer in zip(self.attention, self.kv.layers):
            if index < n_layers:
                layer.trim(n)

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
        source = None if slots == self.filled else self._snapshot_at(slots)
        if slots != self.filled and source is None:
            raise ValueError(f"a hybrid cache filled to {self.filled} keeps no recurrent state at slot {slots}")
        kv = self.kv.copy(slots, capacity)
        copied_kv = dict(zip(self.attention, kv.layers))
        per_layer = [
            _rebuilt(entry, copied_kv.get(i), self.make_recurrent(i) if i in self.recurrent else None)
            for i, entry in enumerate(self.per_layer)
        ]
        copied = HybridKVCache(per_layer, self.make_recurrent)
        copied._restore(source or Snapshot(slots, self._states()))
        copied.marks = [Snapshot(slots, copied._states())]
        copied.replay = self.replay
        return copied

    def save_point(self, slots: int) -> int:
        """The slots `save` writes for a conversation of `slots`: its latest prompt-end mark at or
        below them (core/io/hybrid_state.py); ValueError when it has none."""
        self._interrupted()
        marks = [m.slots for m in self.marks if m.slots <= min(slots, self.filled)]
        if not marks:
            raise ValueError(f"a hybrid cache keeps no prompt-end mark at or below slot {slots} to write")
        return max(marks)

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


def _positions(step: Snapshot) -> np.ndarray:
    """The positions of a step's tokens, one per token (an int start becomes a run)."""
    if isinstance(step.positions, (int, np.integer)):
        return np.arange(step.positions, step.positions + step.ids.shape[0], dtype=np.int64)
    return np.asarray(step.positions, dtype=np.int64)
