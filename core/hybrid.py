"""The books of a hybrid model's cache, backend-neutral: specfill's KV cache for the attention
layers beside the library's own recurrent state (conv + SSM / delta-rule state) for the others.

One object with its own books (core/ops.py's KVCache): `filled` counts the slots every layer has
read (an attention layer's offset; a recurrent layer has read the same tokens, in order). What a
recurrent state cannot do is forget its last tokens, so the cache keeps what it needs to go back:

- a step snapshot before every forward step (the recurrent state as it was; a backend whose
  library writes its state in place, transformers', copies it), with that step's tokens and
  positions and the model (view) that ran it, the last HISTORY steps;
- marks: the recurrent state at the end of a prompt (`mark`, called by the driver after each
  prefill), the last MARKS of them, for the prompt cache's reuse of an earlier turn.

`trim` / `truncate` to slot s: from a mark at s, or else from the latest step snapshot at or below
s, then the tokens between that snapshot and s are run again (the replay: a rejected draft rolls
the recurrent state back by recomputing the accepted tokens). A slot count that no snapshot
reaches is refused (ValueError); `exact_prefix` tells the prompt cache which prefixes it can give.
A step stopped between layers (a cancelled request) is undone on every layer before the cache is
used again (`open` until the step ends).

A backend's cache (backends/mlx/hybrid_cache.py, backends/torch_cuda/hybrid_cache.py) subclasses
HybridBooks with the tensor work: `kv` (its attention layers' cache), `_states` / `_restore`
(the recurrent state out and back), `_tokens` (a step's token ids joined), `_positions` (a
step's positions as NumPy) and `replay` (set by each step of its adapted model), and `save` /
`load` for the prompt store's files (core/io/hybrid_state.py) at `save_point`, a prompt-end mark.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .adapted import AdaptedArgs
from .runtime import RecurrentCache

HISTORY = 32  # step snapshots kept: a drafting round's draft steps and its verification fit
MARKS = 2  # prompt-end snapshots kept: the last turn's (reused) and the one before


class Snapshot:
    """The recurrent layers' state at `slots` filled slots (and the step that followed, if any):
    ids the step's token ids [T], positions an int start or one position per token."""

    def __init__(self, slots: int, states: Any, ids: Any = None, positions: Any = None, model: Any = None):
        self.slots, self.states, self.ids, self.positions, self.model = slots, states, ids, positions, model


class HybridBooks(RecurrentCache):
    """Snapshot, mark, truncate-with-replay and exact_prefix over a backend's hybrid cache (module doc):
    core/runtime.py's RecurrentCache, which is how core and the server know it."""

    kv: Any  # the attention layers' cache: filled, truncate(slots), trim(n) per layer via `layers`
    attention: list[int]  # the model layers with keys, in order (kv.layers[k] is layer attention[k]'s)

    def _init_books(self) -> None:
        self.history: list[Snapshot] = []
        self.marks: list[Snapshot] = []
        self.replay: Callable[[Any, Any, Any, Any], Any] | None = None
        self.open = False  # a step has begun and not ended

    # the backend's tensor work
    def _states(self) -> Any:
        raise NotImplementedError

    def _restore(self, snapshot: Snapshot) -> None:
        raise NotImplementedError

    def _tokens(self, pieces: list[Any]) -> Any:
        raise NotImplementedError

    def _positions(self, step: Snapshot) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def _count(ids: Any) -> int:
        return int(ids.shape[0])

    @property
    def filled(self) -> int:
        return self.kv.filled

    @property
    def layers(self) -> list[Any]:
        """The attention layers' LayerKVCaches (what the methods read)."""
        return self.kv.layers

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    def begin_step(self, model: Any, ids: Any, positions: Any) -> None:
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
            ids = self._tokens([s.ids[: None if e is None else e - s.slots] for s, e in zip(later, ends)])
            positions = np.concatenate(
                [self._positions(s)[: None if e is None else e - s.slots] for s, e in zip(later, ends)]
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
            count += self._count(self.history[-steps].ids)
        if count != n:
            raise ValueError(f"a hybrid cache's last steps do not hold the view's {n} tokens exactly")
        self._restore(self.history[-steps])
        del self.history[-steps:]
        for index, layer in zip(self.attention, self.kv.layers):
            if index < n_layers:
                layer.trim(n)

    def source_at(self, slots: int) -> Snapshot:
        """The state a copy at `slots` starts from: the current one at `filled`, else a snapshot's
        (exact_prefix); ValueError where none is kept."""
        if slots == self.filled:
            return Snapshot(slots, self._states())
        found = self._snapshot_at(slots)
        if found is None:
            raise ValueError(f"a hybrid cache filled to {self.filled} keeps no recurrent state at slot {slots}")
        return found

    def save_point(self, slots: int) -> int:
        """The slots `save` writes for a conversation of `slots`: its latest prompt-end mark at or
        below them (core/io/hybrid_state.py); ValueError when it has none."""
        self._interrupted()
        marks = [m.slots for m in self.marks if m.slots <= min(slots, self.filled)]
        if not marks:
            raise ValueError(f"a hybrid cache keeps no prompt-end mark at or below slot {slots} to write")
        return max(marks)

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        raise ValueError("this backend's hybrid cache is not written to disk (it does not write its recurrent state)")

    def load(self, path: str) -> int:
        raise ValueError("this backend's hybrid cache is not read from disk (it does not read its recurrent state)")


def is_hybrid(args: Any) -> bool:
    """Whether a model (by its args) has recurrent layers: its cache is a RecurrentCache."""
    return isinstance(args, AdaptedArgs) and bool(args.hybrid)


def max_rollback(args: Any) -> int | None:
    """Drafts per round a model's cache can undo: a hybrid's (AdaptedArgs.hybrid) keeps HISTORY step
    snapshots, which hold a round's drafts, the step feeding the pending token and the verification;
    None: any (a KV cache trims any number of slots)."""
    return HISTORY - 2 if is_hybrid(args) else None


def step_positions(positions: Any, count: int) -> np.ndarray:
    """A step's positions, one per token, as NumPy int64 (an int start becomes a run)."""
    if isinstance(positions, (int, np.integer)):
        return np.arange(positions, positions + count, dtype=np.int64)
    return np.asarray(positions, dtype=np.int64)
