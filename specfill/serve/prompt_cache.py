"""The multi-turn prompt cache: conversations' KV caches, reused when a request extends one.

A request whose tokens start with a cached conversation's reuses that KV and prefills only the
rest (with full attention). Policies:
  exact (default): only a dense KV (a full prefill's) is ever reused. A conversation whose KV came
    from sparse prefill (H2O or SpecPrefill) is not reusable as such: its sparse KV is dropped and a
    dense one is rebuilt from its tokens in idle time (COMPLETION_STEP tokens at a time between
    requests); a request arriving before that finished prefills the rest densely itself. Either
    way the next turn attends to every earlier token exactly as a dense run of the whole
    conversation would.
  approximate: the KV is reused as it is (a SpecPrefill cache keeps only its kept prompt tokens;
    an H2O cache holds KV computed under sparse attention); nothing is rebuilt.
  off: no lookup, nothing stored.
The cache holds at most `max_tokens` conversation tokens in all; the least recently used
conversations go first. A request takes its conversation's entry out (its cache is extended in
place) and puts the longer conversation back when it finishes. All methods run on the worker thread.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specfill.core.runtime import KVState, GenerationInfo, PrefillMethod, SamplingConfig

COMPLETION_STEP = 256  # tokens densely prefilled per idle step (a request arriving waits at most one step)
FULL = PrefillMethod("full")


@dataclass
class Entry:
    """One conversation: its tokens and the KV of its first kv.tokens of them.

    exact: kv is (or, while rebuilding, will be) a dense KV: full prefill only.
    rebuilding: the conversation came from sparse prefill under the exact policy; its dense KV is
    built from its tokens in idle time (kv covers the part done so far).
    fixed: the shortest prefix the KV may be cut to (the prompt length of a SpecPrefill whose
    sparse KV is kept under the approximate policy: its first slots hold only the kept tokens).
    """

    tokens: list[int]
    kv: KVState | None
    exact: bool
    rebuilding: bool = False
    fixed: int = 0
    used: float = field(default_factory=time.monotonic)

    @property
    def covered(self) -> int:
        return 0 if self.kv is None else self.kv.tokens


@dataclass(frozen=True)
class Reuse:
    """What a request takes from the cache: the state to pass as `reuse` (None: prefill all), the
    tokens it covers, whether the request hit a conversation (then it prefills with full
    attention) and whether the result stays exact."""

    state: KVState | None = None
    cached: int = 0
    hit: bool = False
    exact: bool = True
    fixed: int = 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PromptCache:
    """LRU set of conversations, bounded by their total tokens (see the module doc)."""

    def __init__(self, max_tokens: int, context: int):
        self.max_tokens = max_tokens
        self.context = context
        self.entries: list[Entry] = []
        self.hits = 0
        self.completed_tokens = 0  # tokens densely rebuilt in idle time so far

    def take(self, ids: list[int], policy: str) -> Reuse:
        """The reuse for a prompt (its entry leaves the cache) or a miss. A conversation counts
        only when it and the prompt share at least half of the tokens of each: a shared system
        prompt alone neither evicts a whole conversation nor turns a long new prompt's requested
        sparse method into a full prefill."""
        if policy == "off":
            return Reuse()
        best, best_match = None, 0
        for entry in self.entries:
            match = min(common_prefix(entry.tokens, ids), len(ids) - 1)
            shared = 2 * match >= max(len(entry.tokens), len(ids))
            if shared and match > best_match and (policy == "exact" or match >= entry.fixed):
                best, best_match = entry, match
        if best is None:
            return Reuse()
        self.entries.remove(best)
        self.hits += 1
        usable = best.exact or policy == "approximate"
        cached = min(best_match, best.covered) if usable else 0
        if cached < 1:  # nothing dense yet: the request's own full prefill completes it
            return Reuse(hit=True)
        state = KVState(best.kv.cache, cached - best.kv.position_offset, best.kv.position_offset)
        return Reuse(state, cached, True, best.exact, best.fixed)

    def put(self, tokens: list[int], kv: KVState | None, *, prompt_tokens: int, method: str, reuse: Reuse,
            policy: str) -> None:
        """Keep a finished conversation (prompt + generated tokens): its KV as is when exact (or
        under the approximate policy), else its tokens only, for a dense rebuild in idle time."""
        if policy == "off" or kv is None or len(tokens) > self.max_tokens:
            return
        dense = method == "full" and reuse.exact
        if dense or policy == "approximate":
            fixed = reuse.fixed if reuse.hit else (prompt_tokens if kv.position_offset else 0)
            entry = Entry(list(tokens), kv, exact=dense, fixed=fixed)
        else:
            entry = Entry(list(tokens), None, exact=True, rebuilding=True)
        self.entries.append(entry)
        self._evict()

    def restore(self, ids: list[int], reuse: Reuse) -> None:
        """Put back what a cancelled or failed request took: its slots below reuse.state.slots were
        never written (the backend prefills after them, or into a grown copy; layers a request
        stopped mid-step left ahead are cut back when the cache is next used: ModelOps.truncate)."""
        if reuse.state is not None:
            self.entries.append(Entry(list(ids[:reuse.cached]), reuse.state, exact=reuse.exact, fixed=reuse.fixed))
            self._evict()

    def _evict(self) -> None:
        while sum(len(e.tokens) for e in self.entries) > self.max_tokens:
            self.entries.remove(min(self.entries, key=lambda e: e.used))

    def pending(self) -> Entry | None:
        """The most recently used conversation whose dense KV is still being rebuilt."""
        waiting = [e for e in self.entries if e.rebuilding]
        return max(waiting, key=lambda e: e.used) if waiting else None

    def _target(self, entry: Entry) -> int:
        return min(len(entry.tokens), self.context - 1)  # the step below needs a slot for one token

    def complete_step(self, model: Any) -> None:
        """Densely prefill the next COMPLETION_STEP tokens of the pending conversation."""
        entry = self.pending()
        if entry is None:
            return
        end = min(entry.covered + COMPLETION_STEP, self._target(entry))
        info = GenerationInfo()
        steps = model.generate_step(entry.tokens[:end], max_tokens=1, sampling=SamplingConfig(),
                                    stop_ids=frozenset(), method=FULL, info=info, reuse=entry.kv)
        for _ in steps:  # one token, sampled from the last position's logits and dropped
            pass
        self.completed_tokens += end - entry.covered
        entry.kv = info.kv
        entry.rebuilding = entry.covered < self._target(entry)

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self.entries), "tokens": sum(len(e.tokens) for e in self.entries),
                "max_tokens": self.max_tokens,
                "pending_tokens": sum(self._target(e) - e.covered for e in self.entries if e.rebuilding),
                "hits": self.hits, "completed_tokens": self.completed_tokens}
