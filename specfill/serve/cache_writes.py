"""The prompt cache's writes to its disk store (prompt_store.py): one conversation at a time, in idle
time (prompt_cache.py decides when), on the worker thread or, `background`, on a writer thread.

Background writes (where the backend's caches may be written from another thread:
core/backend.Backend.threaded_writes): the worker copies the conversation's KV and its speculator
KV (`snapshot`: KVCache.copy, one pass over their bytes) and a writer thread writes the copy
(serialising, hashing, syncing: seconds for a long conversation), so an agent's next turn, which
often arrives while a tool ran, starts at once instead of queueing behind the write
(research/serve/results/background_write.md). The write's end is applied on the worker (`settle`:
at the next idle step, request or server stop). A conversation taken by its next turn, superseded
or dropped while its copy was written has the new file deleted then, as a file written before
would have been; one evicted from memory meanwhile stays on disk only, as it would have.

A failure is not retried for its conversation (Entry.unsaved) and is logged once per kind (a full
disk: one line, however many conversations fail; the next write that succeeds says so).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from specfill.core.runtime import KVState, RecurrentCache, save_point

Entry = Any  # prompt_cache.Entry (not imported: prompt_cache imports this module)

POLL_S = 0.05  # while a background write runs: how often the idle loop looks whether it ended
log = logging.getLogger("specfill.serve")


@dataclass
class Writing:
    """A background write in flight: the conversation, the writer's future of (path, tokens
    stored) for its copy, whether its file is a hybrid's (Entry.whole), and whether the
    conversation left the cache meanwhile by PromptCache._drop (its file then goes)."""

    entry: Entry
    done: Future
    whole: bool
    dropped: bool = False


def snapshot(entry: Entry) -> Entry:
    """A private copy of a conversation for a background write: its KV (at the point its file holds:
    save_point) and its speculator KV copied, sharing no memory with the conversation, which its
    next turn may extend or cut in place while the copy is written."""
    kv, spec = entry.kv, entry.speculator
    slots = save_point(kv.cache, kv.slots)
    copied_spec = None if spec is None else KVState(spec.cache.copy(spec.slots), spec.slots)
    copied = KVState(kv.cache.copy(slots), slots, kv.position_offset, kv.prefix, speculator=copied_spec)
    return replace(entry, tokens=list(entry.tokens), kv=copied, kept_speculator=None, path=None)


class DiskWrites:
    """The writes of one prompt cache to its store (None: none), `background` or on the worker."""

    def __init__(self, store: Any, background: bool):
        self.store = store
        background = background and store is not None
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="specfill-cache-write") if background else None
        self.writing: Writing | None = None
        self.saved = 0  # writes that ended well
        self.failing: Any = None  # the kind of the last write failure, until a write succeeds

    @property
    def entry(self) -> Entry | None:
        """The conversation being written in the background, if any."""
        return None if self.writing is None else self.writing.entry

    def delay(self) -> float | None:
        """While a background write runs: seconds before the idle loop looks again (0: it ended)."""
        if self.writing is None:
            return None
        return 0.0 if self.writing.done.done() else POLL_S

    def dropped(self, entry: Entry) -> None:
        """The conversation left the cache (PromptCache._drop): a file being written for it goes."""
        if self.writing is not None and self.writing.entry is entry:
            self.writing.dropped = True

    def start(self, entry: Entry, entries: list[Entry]) -> None:
        """Write one conversation: here (then recorded in `entries` at once), or a copy of it on the
        writer thread (recorded by `settle`)."""
        whole = isinstance(entry.kv.cache, RecurrentCache)
        if self.writer is not None:
            try:
                copied = snapshot(entry)
            except Exception as err:  # noqa: BLE001 - no memory for the copy: as a failed write
                self._failed(entry, err)
                return
            self.writing = Writing(entry, self.writer.submit(self.store.write, copied), whole)
            return
        try:
            path, stored = self.store.write(entry)
        except Exception as err:  # noqa: BLE001 - a full disk must not stop the server
            self._failed(entry, err)
            return
        self._written(entry, entries, path, stored, whole)

    def settle(self, entries: list[Entry], wait: bool) -> None:
        """Apply the end of the background write in flight to `entries`, if it ended (wait: wait for
        it first)."""
        writing = self.writing
        if writing is None or not (wait or writing.done.done()):
            return
        self.writing = None
        try:
            path, stored = writing.done.result()
        except Exception as err:  # noqa: BLE001 - a full disk must not stop the server
            self._failed(writing.entry, err)
            return
        entry = writing.entry
        if not any(e is entry for e in entries):
            n = len(entry.tokens)
            superseded = any(len(e.tokens) >= n and e.tokens[:n] == entry.tokens for e in entries)
            if writing.dropped or superseded:  # taken, superseded or dropped meanwhile: its file goes as it would have
                self._succeeded()
                self.store.delete(path)
                return
            entry.kv, entry.kept_speculator = None, None  # evicted from memory meanwhile: on disk only now
            entries.append(entry)
        self._written(entry, entries, path, stored, writing.whole)

    def _succeeded(self) -> None:
        if self.failing is not None:
            log.info("prompt cache: writing to %s again", self.store.directory)
            self.failing = None
        self.saved += 1

    def _failed(self, entry: Entry, err: Exception) -> None:
        entry.unsaved = True
        # the kind: an OSError's errno; else the type (a backend writer's message may vary per file)
        kind = err.errno if isinstance(err, OSError) and err.errno else type(err).__name__
        if kind != self.failing:
            log.warning(
                "prompt cache: cannot write an entry of %d tokens to %s, %s: %s (it stays in memory; "
                "a failure of this kind is not logged again until a write succeeds)",
                len(entry.tokens),
                self.store.directory,
                self.store.free_space(),
                err,
            )
        self.failing = kind

    def _written(self, entry: Entry, entries: list[Entry], path: str, stored: int, whole: bool) -> None:
        """A conversation's file is in place (whole: a hybrid's, reusable at its end only): recorded,
        and the directory's bound applied to `entries`."""
        entry.path, entry.stored, entry.whole = path, stored, whole
        dropped = self.store.evict(keep=path)
        self._succeeded()
        for gone in dropped:  # the store's bound evicted these files (oldest first)
            for other in [e for e in entries if e.path == gone]:
                other.path = None
                if other.kv is None:
                    entries.remove(other)
        entry.unsaved = entry.path is None  # larger than the store's bound by itself: not tried again
