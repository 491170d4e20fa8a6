"""The SpecPrefill speculator's dense KV of a kept conversation, brought up to its end (prompt_cache.py).

The prompt cache keeps, per conversation, the speculator's own KV beside the main model's
(KVState.speculator) so that a later SpecPrefill turn's speculator prefills only its new tokens. A
sparse turn leaves it short: the composition keeps only the dense part its H2O speculator started
from, a full or H2O turn does not extend it, and no turn feeds it the reply. The cache brings it
densely up to what the main model's KV covers (the whole conversation, reply included) in idle time,
after the main model's dense rebuild, and a SpecPrefill request arriving first has it done before it
runs (PromptCache.finish): every SpecPrefill turn's speculator then reads a dense, exact KV of the
conversation so far and prefills only the new tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specfill.core.hybrid import is_hybrid
from specfill.core.methods.prefill import prefill
from specfill.core.runtime import KVState

Entry = Any  # a prompt_cache.Entry (not imported: prompt_cache imports this module)


def speculator_context(model: Any, speculator: Any) -> int | None:
    """The context of `speculator` (the server's --speculator: "self:K" or a loaded model) on `model`'s
    backend; None when its KV is not kept densely: a hybrid speculator's (its recurrent state is kept
    only where a cache marks it, never at an arbitrary conversation point: the driver keeps none of
    it after a SpecPrefill turn either), or no speculator."""
    if speculator is None:
        return None
    spec = model.speculator_model(speculator)[0]
    if is_hybrid(spec.args):  # a hybrid's cache (core/driver._speculator_kv)
        return None
    return int(spec.args.max_position_embeddings)


def extend_speculator_kv(model: Any, speculator: Any, ids: Sequence[int], kv: KVState | None, room: int) -> KVState:
    """The speculator's dense KV of ids (slot i = token i): `kv`'s first slots (a dense KV of a prefix
    of ids) kept, the rest prefilled with full attention into the same cache (grown to `room` slots
    at least where it is smaller); kv None: a new cache of `room` slots, all of ids prefilled."""
    spec, step = model.speculator_model(speculator)
    ops, start = model.ops, 0 if kv is None else min(kv.slots, len(ids))
    with ops.device_scope():
        if kv is None:
            cache = ops.new_cache(spec, max(room, len(ids)))
        else:
            cache = kv.cache
            cache.truncate(start)  # slots past it (look-ahead tokens, an older turn's) are not this conversation's
            cache = cache if cache.capacity >= len(ids) else cache.grown(max(room, len(ids)))
        if start < len(ids):
            prefill(ops, spec, ops.tokens(np.asarray(ids[start:], dtype=np.int64)), start, cache, step_size=step)
    return KVState(cache, len(ids))


class SpeculatorRebuild:
    """Which kept conversations' speculator KV is built up, to where, and one step of it (the
    module doc). model, speculator: the server's main model and --speculator (None: none is built;
    a hybrid speculator's neither: speculator_context)."""

    def __init__(self, model: Any = None, speculator: Any = None):
        context = None if speculator is None else speculator_context(model, speculator)
        self.speculator = speculator if context else None
        self.context = context or 0
        self.tokens = 0  # tokens prefilled into conversations' speculator KV so far

    @staticmethod
    def covered(entry: Entry) -> int:
        """The tokens the entry's speculator KV covers (0: none)."""
        return 0 if entry.speculator is None else entry.speculator.slots

    def end(self, entry: Entry) -> int:
        """The tokens the entry's speculator KV is to cover: what its dense main KV covers (prompt and
        reply), within the speculator's context. 0: none (no speculator; a conversation that never ran
        SpecPrefill; a main KV not dense, or still being rebuilt)."""
        kv = entry.kv
        if self.speculator is None or kv is None or kv.position_offset or not entry.exact or entry.rebuilding:
            return 0
        if entry.speculator is None and not entry.specprefilled:
            return 0
        return min(kv.tokens, self.context - 1)

    def short(self, entry: Entry) -> bool:
        return self.covered(entry) < self.end(entry)

    def lagging(self, entries: list[Entry]) -> Entry | None:
        """The most recently used conversation whose speculator KV is short of its end."""
        waiting = [e for e in entries if self.short(e)]
        return max(waiting, key=lambda e: e.used) if waiting else None

    def step(self, model: Any, entry: Entry, size: int, stop: int | None = None) -> bool:
        """Densely prefill the next `size` tokens of the entry's speculator KV (to `stop` at most; its
        cache reserved for its whole end at once); whether any were."""
        goal, start = self.end(entry), self.covered(entry)
        end = min(start + size, goal, goal if stop is None else stop)
        if end <= start or entry.kv is None:
            return False
        entry.kv.speculator = extend_speculator_kv(model, self.speculator, entry.tokens[:end], entry.speculator, goal)
        entry.kept_speculator = None
        self.tokens += end - start
        return True
