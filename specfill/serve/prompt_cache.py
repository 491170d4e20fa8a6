"""The prompt cache: many conversations' KV caches, the longest cached prefix of a prompt reused.

A request whose tokens start with tokens of a cached conversation (its own earlier turn; another
agent's conversation sharing the system prompt and tool definitions) reuses that KV for the
longest such prefix (however short) over every kept conversation and prefills only the rest with
the request's method from the reused prefix (docs/methods.md): full attention; H2O walked from the
prefix; SpecPrefill with the speculator on its own KV of the conversation (kept in the entry's
KVState beside the main model's; over an H2O speculator, H2O walked from that KV), the kept new
tokens over the prefix; auto deciding among them on the new part's length. A prefix whose slot i
holds token i (a dense one; under the approximate policy an H2O run's too) serves every method; the
rest after a SpecPrefill KV (the approximate policy's: its slots hold kept tokens) is prefilled with
full attention. Policies:
  exact (default): only a dense KV (a full prefill's) is ever reused. A conversation whose KV came
    from sparse prefill (H2O, SpecPrefill, either from a reused prefix) is not reusable as such: its
    sparse part is dropped and rebuilt densely from its tokens in idle time (COMPLETION_STEP tokens
    at a time between requests, from the dense prefix the method ran from); a request arriving before
    that finished prefills the rest densely itself (a sparse method's request completes the rebuild
    first: finish). Either way the next turn attends to every earlier token exactly as a dense run of
    the whole conversation would. With the server's speculator (use_speculator), a conversation that
    ran SpecPrefill (the composition, auto's too) or keeps a speculator KV then has that KV built up
    densely in the same way, to what the main KV covers (prompt and reply: speculator_kv.py), before
    it is written to disk; a SpecPrefill request arriving first has it done (finish).
  approximate: the KV is reused as it is (a SpecPrefill cache keeps only its kept prompt tokens, so
    it is never cut into them; an H2O cache holds KV computed under sparse attention, and a method
    runs from it as from a dense one: approximate, as the policy is); nothing is rebuilt.
  off: no lookup, nothing stored.

Hybrid models (recurrent layers beside attention): their recurrent state cannot be cut back to any
prefix, only to the points the cache kept a snapshot of (each prompt's end, its last steps:
exact_prefix), the longest such point being the longest usable prefix. Their disk file holds one, the
last prompt end (prompt_store.py): a disk-only hybrid entry serves exactly that many tokens (Entry.whole).

Taking or copying (the rule that keeps a conversation safe): a request whose prompt shares all of
a conversation but at most its last max(CUT_SLACK, 1/8) tokens (its own next turn: the reply's last
tokens often re-tokenize differently) takes that entry out, extends its cache in place and puts the
longer conversation back when it finishes. A shorter shared prefix (a second conversation sharing a
system prompt; an edited history) gets a copy of those slots (KVCache.copy: one copy of the prefix's
keys and values, far cheaper than prefilling it) and the conversation stays as it was. A request
whose earlier turn is kept only sparsely (exact policy) takes it out too (its full prefill replaces it).

Bounds: KV bytes (KVCache.nbytes) at most `max_bytes`, tokens at most `max_tokens` (None: unbounded);
the least recently used go first; one larger than a bound is not kept. With a disk store
(prompt_store.py) an entry is written to disk in idle time, WRITE_AFTER_S into a quiet spell; one
evicted from memory then stays on disk, loaded again when a prompt reuses it, and a restarted server
finds the same model's entries there. All methods run on the worker thread.

The writes themselves (on the worker, or a copy of the KV on a writer thread: `background`) are
cache_writes.py's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, RecurrentCache, SamplingConfig

from .cache_writes import DiskWrites
from .speculator_kv import SpeculatorRebuild

COMPLETION_STEP = 256  # tokens densely prefilled per idle step (a request arriving waits at most one step)
WRITE_AFTER_S = 2.0  # quiet after a put before a disk write, which an agent's next turn would wait for (serve.md)
CUT_SLACK = 64  # a conversation's tokens past the shared prefix that a request may cut off (or 1/8 of them)
FULL = PrefillMethod("full")
log = logging.getLogger("specfill.serve")


@dataclass
class Entry:
    """One conversation: its tokens and the KV of its first kv.tokens of them.

    exact: kv is (or, while rebuilding, will be) a dense KV: full prefill only.
    rebuilding: the conversation came from sparse prefill under the exact policy; its dense KV is
    built from its tokens in idle time (kv covers the part done so far).
    fixed: the shortest prefix the KV may be cut to (the prompt length of a SpecPrefill whose
    sparse KV is kept under the approximate policy: its first slots hold only the kept tokens).
    path: its file in the disk store (None: not written); with kv None it lives on disk only and
    `stored` is the number of tokens its file's KV stands for. unsaved: its write failed (not retried).
    whole: its file is reusable at its `stored` tokens only, not at a shorter prefix (a hybrid
    model's: the recurrent state it holds is at that point).
    """

    tokens: list[int]
    kv: KVState | None
    exact: bool
    rebuilding: bool = False
    fixed: int = 0
    used: float = field(default_factory=time.monotonic)
    path: str | None = None
    stored: int = 0
    unsaved: bool = False
    whole: bool = False
    kept_speculator: KVState | None = None  # a rebuilding entry's speculator KV while kv has none
    specprefilled: bool = False  # a turn of it ran SpecPrefill: its speculator KV is built up (speculator_kv.py)

    @property
    def speculator(self) -> KVState | None:
        """The SpecPrefill speculator's dense KV of this conversation (KVState.speculator), if kept."""
        return self.kv.speculator if self.kv is not None and self.kv.speculator is not None else self.kept_speculator

    @property
    def covered(self) -> int:
        if self.kv is not None:
            return self.kv.tokens
        return self.stored if self.path is not None else 0

    @property
    def in_memory(self) -> bool:
        return self.kv is not None or self.rebuilding

    @property
    def nbytes(self) -> int:
        main = 0 if self.kv is None else int(self.kv.cache.nbytes)
        return main + (0 if self.speculator is None else int(self.speculator.cache.nbytes))


@dataclass(frozen=True)
class Reuse:
    """What a request takes from the cache: the state to pass as `reuse` (None: prefill all), the
    tokens it covers, whether the request hit a conversation (then it prefills without drafting, by
    full attention without a state), whether the result stays exact, and whether the state is a copy
    (the conversation it came from stays in the cache)."""

    state: KVState | None = None
    cached: int = 0
    hit: bool = False
    exact: bool = True
    fixed: int = 0
    copied: bool = False


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def exact_prefix(entry: Entry, tokens: int) -> int:
    """The longest prefix of at most `tokens` the entry's KV can be cut to exactly: any, except for
    a hybrid model's cache, whose recurrent state exists only at the points it kept (KVCache
    `exact_prefix`: the end of each prompt, the last steps); a cache that cannot stand there is not
    reused there."""
    cache = None if entry.kv is None else entry.kv.cache
    if cache is None and entry.whole:  # a hybrid's file: its one point
        return tokens if tokens >= entry.stored else 0
    if not isinstance(cache, RecurrentCache):
        return tokens
    offset = entry.kv.position_offset
    return cache.exact_prefix(tokens - offset) + offset if tokens > offset else tokens


def cuttable(entry: Entry, match: int) -> bool:
    """Whether a prompt sharing `match` tokens with the entry is its own next turn (see the module doc)."""
    return len(entry.tokens) - match <= max(CUT_SLACK, len(entry.tokens) // 8)


class PromptCache:
    """LRU set of conversations, bounded by their KV bytes and tokens (see the module doc)."""

    def __init__(
        self,
        max_tokens: int | None,
        context: int,
        max_bytes: int | None = None,
        store: Any = None,
        background: bool = False,
    ):
        """background: write to the disk store from a thread of its own (cache_writes.py)."""
        self.spec_rebuild = SpeculatorRebuild()  # none until use_speculator
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self.context = context
        self.store = store  # prompt_store.PromptStore or None
        self.entries: list[Entry] = [] if store is None else store.scan()
        self.hits = 0
        self.copies = 0  # hits served by a copy of a shared prefix
        self.completed_tokens = 0  # tokens densely rebuilt in idle time so far
        self.kept_at = float("-inf")  # when put last ran (a request's end): disk writes wait for quiet after it
        self.writes = DiskWrites(store, background)

    def take(self, ids: list[int], policy: str) -> Reuse:
        """The reuse for a prompt (the longest usable cached prefix, however short; its entry leaves
        the cache or lends a copy) or a miss."""
        if policy == "off":
            return Reuse()
        self.writes.settle(self.entries, wait=False)
        best, best_cached, best_match, best_key, stale = None, 0, 0, (), []
        for entry in self.entries:
            match = min(common_prefix(entry.tokens, ids), len(ids) - 1)
            if match < 1:
                continue
            usable = (entry.exact or policy == "approximate") and match >= entry.fixed
            cached = exact_prefix(entry, min(match, entry.covered)) if usable else 0
            key = (cached, cuttable(entry, match), entry.used)  # ties: its own turn (no copy), then the newest
            if cached > 0 and key > best_key:
                best, best_cached, best_match, best_key = entry, cached, match, key
            elif cached == 0 and usable and entry.covered > 0 and not entry.rebuilding:
                continue  # a hybrid's, with no recurrent state kept within the match: kept, not reused
            elif cached == 0 and cuttable(entry, match) and (policy == "exact" or match >= entry.fixed):
                stale.append(entry)  # its earlier turn, unusable (sparse) or still being rebuilt
        if best is not None and best.kv is None:
            if not self._load(best):
                return self.take(ids, policy)  # its file is gone or broken: dropped, look again
            best_cached = exact_prefix(best, best_cached)  # what the cache read back can stand at
            if best_cached < 1:
                return Reuse()
        for entry in stale:
            self._drop(entry)
        if best is None:
            if stale:  # nothing dense yet: the request's own full prefill replaces it
                self.hits += 1
                return Reuse(hit=True)
            return Reuse()
        self.hits += 1
        offset = best.kv.position_offset
        spec = best.speculator if offset == 0 else None  # the speculator's KV of the prompt's first tokens
        if cuttable(best, best_match):
            if spec is not None:  # its slots past the match hold the conversation's cut-off tokens
                spec = KVState(spec.cache, min(spec.slots, best_cached))
            self._drop(best)  # extended in place; put back (and written again) when the turn finishes
            state = KVState(best.kv.cache, best_cached - offset, offset, speculator=spec)
            return Reuse(state, best_cached, True, best.exact, best.fixed)
        best.used = time.monotonic()
        self.copies += 1
        if spec is not None:  # its own copy too: the request extends it
            n = min(spec.slots, best_cached)
            spec = KVState(spec.cache.copy(n), n)
        state = KVState(best.kv.cache.copy(best_cached - offset), best_cached - offset, offset, speculator=spec)
        return Reuse(state, best_cached, True, best.exact, best.fixed, copied=True)

    def put(
        self, tokens: list[int], kv: KVState | None, *, prompt_tokens: int, method: str, reuse: Reuse, policy: str
    ) -> None:
        """Keep a finished conversation (prompt + generated tokens): its KV as is when exact (or
        under the approximate policy), else its tokens only, for a dense rebuild in idle time."""
        self.kept_at = time.monotonic()
        if policy == "off" or kv is None or (self.max_tokens is not None and len(tokens) > self.max_tokens):
            return
        dense = method == "full" and reuse.exact
        if dense or policy == "approximate":
            fixed = reuse.fixed if reuse.hit else (prompt_tokens if kv.position_offset else 0)
            if method == "specprefill" and kv.position_offset:  # its kept tokens sit after the reused prefix
                fixed = prompt_tokens
            entry = Entry(list(tokens), kv, exact=dense, fixed=fixed, specprefilled=method == "specprefill")
        else:  # rebuilt densely in idle time, from the dense prefix a sparse method ran from, speculator's KV kept
            start = KVState(kv.cache, kv.prefix, speculator=kv.speculator) if kv.prefix > 0 and reuse.exact else None
            if start is None and method == "h2o" and reuse.state is not None and reuse.exact and not kv.position_offset:
                hybrid = isinstance(kv.cache, RecurrentCache)  # a hybrid's: only where it kept its state
                if not hybrid or kv.cache.exact_prefix(reuse.cached) == reuse.cached:
                    start = KVState(kv.cache, reuse.cached)  # H2O from a dense prefix: rebuilt from there
            entry = Entry(list(tokens), start, exact=True, rebuilding=True, kept_speculator=kv.speculator)
            entry.specprefilled = method == "specprefill"
        if self.max_bytes is not None and entry.nbytes > self.max_bytes:
            return
        for old in sorted(
            (
                e
                for e in self.entries
                if len(e.tokens) <= len(tokens)
                and e.tokens == entry.tokens[: len(e.tokens)]
                and (entry.exact or not e.exact)
            ),
            key=lambda e: e.covered,
        ):
            self._drop(old)  # a shorter prefix of this conversation: superseded
            if entry.rebuilding and old.exact and old.kv is not None and old.covered > entry.covered:
                entry.kv = old.kv  # its dense KV: the rebuild goes on from there
        self.entries.append(entry)
        self._evict()

    def restore(self, ids: list[int], reuse: Reuse) -> None:
        """Put back what a cancelled or failed request took: its slots below reuse.state.slots were
        never written (the backend prefills after them, or into a grown copy; layers a request
        stopped mid-step left ahead are cut back when the cache is next used: ModelOps.truncate).
        A copy is dropped: the conversation it came from is still here."""
        if reuse.state is not None and not reuse.copied:
            self.entries.append(Entry(list(ids[: reuse.cached]), reuse.state, exact=reuse.exact, fixed=reuse.fixed))
            self._evict()

    def _drop(self, entry: Entry) -> None:
        """Remove an entry, its file too (one being written: when its write ends, DiskWrites.settle)."""
        self.writes.dropped(entry)
        self.entries.remove(entry)
        if entry.path is not None and self.store is not None:
            self.store.delete(entry.path)

    def _load(self, entry: Entry) -> bool:
        """Read a disk-only entry's KV back (False: its file failed to load and was dropped)."""
        try:
            entry.kv = self.store.load(entry)
        except Exception as err:  # noqa: BLE001 - a broken file is skipped, never a crash
            log.warning("prompt cache: skipping %s: %s", entry.path, err)
            self._drop(entry)
            return False
        entry.used = time.monotonic()
        self._evict(keep=entry)
        return True

    def memory_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def memory_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries if e.in_memory)

    def _evict(self, keep: Entry | None = None) -> None:
        """Least recently used first until both bounds hold; one with a file stays on disk only."""
        while (self.max_tokens is not None and self.memory_tokens() > self.max_tokens) or (
            self.max_bytes is not None and self.memory_bytes() > self.max_bytes
        ):
            victims = [e for e in self.entries if e.in_memory and e is not keep]
            if not victims:
                return
            victim = min(victims, key=lambda e: e.used)
            if victim.path is not None and not victim.rebuilding:
                victim.kv = None
            else:
                self.entries.remove(victim)

    def pending(self) -> Entry | None:
        """The most recently used conversation whose dense KV is still being rebuilt."""
        waiting = [e for e in self.entries if e.rebuilding]
        return max(waiting, key=lambda e: e.used) if waiting else None

    def unsaved(self) -> Entry | None:
        """The most recently used conversation to write to the disk store (None: none, or no store,
        or a read-only one)."""
        if self.store is None or not self.store.writable:
            return None
        ready = [e for e in self.entries if not e.rebuilding and not self.spec_rebuild.short(e)]  # built up first
        writing = self.writes.entry
        waiting = [e for e in ready if e.kv is not None and e.path is None and not e.unsaved and e is not writing]
        return max(waiting, key=lambda e: e.used) if waiting else None

    def has_idle_work(self) -> bool:
        return self.idle_delay() is not None

    def idle_delay(self) -> float | None:
        """Seconds before idle_step may run (0: now; None: no work): rebuilds now, writes WRITE_AFTER_S after a put."""
        if self.pending() is not None or self.spec_rebuild.lagging(self.entries) is not None:
            return 0.0
        if (delay := self.writes.delay()) is not None:  # one write at a time: the next waits for this one's end
            return delay
        return None if self.unsaved() is None else max(0.0, self.kept_at + WRITE_AFTER_S - time.monotonic())

    def idle_step(self, model: Any) -> None:
        """One step of idle work: rebuilding a dense KV first, then the speculator's, then a disk write
        (a background write's end applied first)."""
        self.writes.settle(self.entries, wait=False)
        if self.pending() is not None:
            self.complete_step(model)
        elif (entry := self.spec_rebuild.lagging(self.entries)) is not None:
            self.speculator_step(model, entry)
        elif self.writes.entry is None and (entry := self.unsaved()) is not None:
            self.writes.start(entry, self.entries)

    @property
    def saved(self) -> int:
        return self.writes.saved

    def settle(self) -> None:
        """Wait for the background write in flight, if any, and apply its end (a server's stop)."""
        self.writes.settle(self.entries, wait=True)

    def _target(self, entry: Entry) -> int:
        return min(len(entry.tokens), self.context - 1)  # the step below needs a slot for one token

    def finish(self, ids: list[int], model: Any, speculate: bool = False) -> bool:
        """Complete the dense rebuild of every conversation a prompt continues, up to what they share
        (a sparse method then runs from the whole dense prefix: the module doc); speculate (a request
        that may run SpecPrefill): the speculator's KV of the one it reuses too (speculator_kv.py).
        Whether there was any of it to do (the request then waited for it)."""
        worked = False
        for entry in [e for e in self.entries if e.rebuilding]:
            end = min(common_prefix(entry.tokens, ids), len(ids) - 1, self._target(entry))
            while entry.rebuilding and entry.covered < end:
                self.complete_step(model, entry, end)
                worked = True
        if speculate and self.entries:  # the longest dense match, as take picks (ties: the newest)
            best = max(self.entries, key=lambda e: (min(common_prefix(e.tokens, ids), e.covered), e.used))
            end = min(common_prefix(best.tokens, ids), len(ids) - 1, self.spec_rebuild.end(best))
            while self.spec_rebuild.covered(best) < end:
                self.speculator_step(model, best, end)
                worked = True
        return worked

    def use_speculator(self, model: Any, speculator: Any) -> None:
        """Build every SpecPrefill conversation's speculator KV densely up to its end (speculator_kv.py)."""
        self.spec_rebuild = SpeculatorRebuild(model, speculator)

    def speculator_step(self, model: Any, entry: Entry, stop: int | None = None) -> None:
        """The next COMPLETION_STEP tokens of the entry's speculator KV, to `stop` at most."""
        if self.spec_rebuild.step(model, entry, COMPLETION_STEP, stop):
            if entry.kv is not None and self.max_bytes is not None and entry.nbytes > self.max_bytes:
                entry.kv.speculator, entry.specprefilled = None, False  # too large with it: kept without
            if entry.path is not None and self.store is not None and not self.spec_rebuild.short(entry):
                self.store.save_speculator(entry)  # its file was written before: the longer KV beside it
            self._evict(keep=entry)

    def complete_step(self, model: Any, entry: Entry | None = None, stop: int | None = None) -> None:
        """Densely prefill the next COMPLETION_STEP tokens of `entry` (the pending conversation), to
        `stop` at most."""
        entry = entry or self.pending()
        if entry is None:
            return
        end = min(entry.covered + COMPLETION_STEP, self._target(entry), stop or self._target(entry))
        info = GenerationInfo()
        steps = model.generate_step(
            entry.tokens[:end],
            max_tokens=1,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=FULL,
            info=info,
            reuse=entry.kv,
        )
        for _ in steps:  # one token, sampled from the last position's logits and dropped
            pass
        self.completed_tokens += end - entry.covered
        if info.kv.speculator is None:  # a rebuild from the start: the speculator's KV goes on beside it
            info.kv.speculator = entry.speculator
        entry.kv, entry.kept_speculator = info.kv, None  # kv holds it now (an evicted kv frees it too)
        entry.rebuilding = entry.covered < self._target(entry)
        self._evict(keep=entry)

    def stats(self) -> dict[str, Any]:
        memory = [e for e in self.entries if e.in_memory]
        disk = {e.path: e for e in self.entries if e.path is not None}
        return {
            "entries": len(memory),
            "tokens": sum(len(e.tokens) for e in memory),
            "max_tokens": self.max_tokens,
            "bytes": self.memory_bytes(),
            "max_bytes": self.max_bytes,
            "pending_tokens": sum(self._target(e) - e.covered for e in self.entries if e.rebuilding),
            "hits": self.hits,
            "copies": self.copies,
            "completed_tokens": self.completed_tokens,
            "speculator_tokens": self.spec_rebuild.tokens,
            "idle_work": self.has_idle_work(),  # a rebuild, a speculator build-up or a disk write to come
            "disk_entries": len(disk),
            "disk_bytes": None if self.store is None else self.store.nbytes,
            "max_disk_bytes": None if self.store is None else self.store.max_bytes,
            "saved": self.saved,
        }
