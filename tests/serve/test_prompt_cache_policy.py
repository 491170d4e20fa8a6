"""PromptCache bookkeeping without a model: longest-prefix matching, taking vs copying, policies,
the memory and token bounds (LRU)."""

from __future__ import annotations

from specfill.core.runtime import KVState
from specfill.serve.prompt_cache import PromptCache, Reuse

PER_SLOT = 10  # bytes a FakeCache slot occupies


class FakeCache:
    """A KVCache's books only: nbytes and copy (slots reserved = slots filled)."""

    def __init__(self, slots: int, copied: bool = False):
        self.slots, self.copied = slots, copied

    @property
    def nbytes(self) -> int:
        return self.slots * PER_SLOT

    def copy(self, slots: int, capacity: int | None = None) -> FakeCache:
        assert slots <= self.slots
        return FakeCache(max(slots, capacity or slots), copied=True)


def dense(n: int) -> KVState:
    return KVState(FakeCache(n), n)


def keep(cache: PromptCache, tokens: list[int], method: str = "full", policy: str = "exact") -> None:
    cache.put(tokens, dense(len(tokens)), prompt_tokens=len(tokens) - 1, method=method, reuse=Reuse(), policy=policy)


def test_exact_reuse_and_truncation():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(100)), dense(99), prompt_tokens=80, method="full", reuse=Reuse(), policy="exact")
    got = cache.take(list(range(90)) + [7, 7, 7], "exact")  # its own next turn: shares 90 of 100 tokens
    assert got.hit and got.cached == 90 and got.state.slots == 90 and got.exact and not got.copied
    assert cache.entries == []  # taken out: the request extends it in place


def test_whole_prompt_cached_leaves_one_token_to_prefill():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(50)), dense(50), prompt_tokens=40, method="full", reuse=Reuse(), policy="exact")
    assert cache.take(list(range(50)), "exact").cached == 49


def test_a_shared_system_prompt_is_copied_and_keeps_the_conversation():
    """A second conversation sharing the first 30 of a 200-token conversation gets a copy of those
    slots; the conversation stays whole, and a copy is not put back by restore."""
    cache = PromptCache(None, 4096)
    keep(cache, list(range(200)))
    source = cache.entries[0].kv.cache
    prompt = list(range(30)) + [999] * 500  # a long new part: still reused (full prefill of the rest)
    got = cache.take(prompt, "exact")
    assert got.hit and got.copied and got.cached == 30 and got.state.slots == 30
    assert got.state.cache is not source and got.state.cache.copied
    assert len(cache.entries) == 1 and cache.entries[0].kv.cache is source and cache.entries[0].covered == 200
    cache.restore(prompt, got)  # a cancelled request: the copy is dropped, nothing doubles
    assert len(cache.entries) == 1 and cache.copies == 1 and cache.hits == 1
    assert not cache.take(list(range(100)), "off").hit


def test_a_prefix_of_any_length_is_reused():
    """However short the shared prefix (a system prompt before a long new part), it is reused: every
    method runs from a reused prefix (no whole-prompt run instead)."""
    cache = PromptCache(None, 4096)
    keep(cache, list(range(200)))
    got = cache.take(list(range(30)) + [999] * 500, "exact")
    assert got.hit and got.cached == 30 and got.copied and len(cache.entries) == 1
    got = cache.take(list(range(200)) + [999] * 150, "exact")  # its next turn, a long new part
    assert got.cached == 200 and not got.copied and cache.entries == []


def test_longest_prefix_over_every_conversation():
    cache = PromptCache(None, 4096)
    keep(cache, list(range(20)) + [500] * 300)  # shares 20 with the prompt
    keep(cache, list(range(60)) + [600] * 300)  # shares 60
    keep(cache, [7] * 100)  # shares nothing
    got = cache.take(list(range(80)), "exact")
    assert got.cached == 60 and got.copied and len(cache.entries) == 3


def test_a_tie_goes_to_the_conversation_the_prompt_continues():
    cache = PromptCache(None, 4096)
    keep(cache, list(range(50)) + [1] * 10)  # the prompt's own earlier turn (the reply re-tokenized)
    keep(cache, list(range(50)) + [2] * 300)  # newer, sharing as much: would need a copy
    got = cache.take(list(range(50)) + [3] * 20, "exact")
    assert got.cached == 50 and not got.copied and [len(e.tokens) for e in cache.entries] == [350]


def test_a_short_conversation_is_the_next_turn_and_is_taken_out():
    """A conversation sharing all but its last few tokens is the prompt's earlier turn: taken out
    (extended in place), however long the new part."""
    cache = PromptCache(None, 4096)
    keep(cache, list(range(40)))
    got = cache.take(list(range(30)) + [999] * 500, "exact")
    assert got.cached == 30 and not got.copied and cache.entries == []


def test_a_conversation_extending_a_kept_one_supersedes_it():
    cache = PromptCache(None, 4096)
    keep(cache, list(range(300)))
    got = cache.take(list(range(20)) + [5] * 10, "exact")  # a copy: the 300-token conversation stays
    cache.put(
        list(range(20)) + [5] * 15,
        KVState(got.state.cache, 35),
        prompt_tokens=30,
        method="full",
        reuse=got,
        policy="exact",
    )
    keep(cache, list(range(300)) + [1, 2, 3])  # the first conversation, one turn on (and its prefix)
    assert sorted(len(e.tokens) for e in cache.entries) == [35, 303]


def test_sparse_conversation_is_rebuilt_under_exact():
    cache = PromptCache(1000, 4096)
    sparse = KVState(FakeCache(12), 12, 88)  # 10 kept of 100 prompt tokens + 2 generated
    cache.put(list(range(103)), sparse, prompt_tokens=100, method="specprefill", reuse=Reuse(), policy="exact")
    entry = cache.entries[0]
    assert entry.kv is None and entry.rebuilding and cache.pending() is entry
    assert cache.stats()["pending_tokens"] == 103
    got = cache.take(list(range(103)) + [5], "exact")
    assert got.hit and got.state is None and got.cached == 0  # the request prefills it all, densely
    assert cache.entries == []  # its result replaces the conversation


def test_a_sparse_turn_extending_a_dense_conversation_rebuilds_from_its_kv():
    cache = PromptCache(None, 4096)
    keep(cache, list(range(100)))
    dense_kv = cache.entries[0].kv
    sparse = KVState(FakeCache(30), 30, 370)
    cache.put(list(range(400)), sparse, prompt_tokens=398, method="h2o", reuse=Reuse(), policy="exact")
    (entry,) = cache.entries
    assert entry.rebuilding and entry.kv is dense_kv and cache.stats()["pending_tokens"] == 300


def test_sparse_conversation_kept_under_approximate():
    cache = PromptCache(1000, 4096)
    sparse = KVState(FakeCache(12), 12, 88)
    cache.put(list(range(103)), sparse, prompt_tokens=100, method="specprefill", reuse=Reuse(), policy="approximate")
    assert cache.pending() is None and cache.entries[0].fixed == 100
    assert not cache.take(list(range(99)) + [5] * 3, "approximate").hit  # cutting into the kept tokens: no
    got = cache.take(list(range(101)) + [5], "approximate")
    assert got.cached == 100 and got.state.slots == 12 and got.state.position_offset == 88 and not got.exact


def test_exact_request_does_not_reuse_an_approximate_cache():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(60)), dense(60), prompt_tokens=50, method="h2o", reuse=Reuse(), policy="approximate")
    got = cache.take(list(range(60)) + [1], "exact")
    assert got.hit and got.state is None
    cache.put(list(range(60)), dense(60), prompt_tokens=50, method="h2o", reuse=Reuse(), policy="approximate")
    cache.put(list(range(10)) + [5] * 90, dense(100), prompt_tokens=99, method="full", reuse=Reuse(), policy="exact")
    got = cache.take(list(range(40)) + [3] * 50, "exact")  # the dense one's 10, never the sparse one's 40
    assert got.cached == 10 and got.exact


def test_lru_by_tokens():
    cache = PromptCache(250, 4096)
    for base in (0, 1000, 2000):
        keep(cache, list(range(base, base + 100)))
    assert [e.tokens[0] for e in cache.entries] == [1000, 2000]  # the oldest went
    keep(cache, list(range(5000, 5300)))
    assert [e.tokens[0] for e in cache.entries] == [1000, 2000]  # larger than the bound: not kept


def test_lru_by_memory():
    """The bytes bound counts what the caches occupy; a reuse (a copy too) makes an entry recent."""
    cache = PromptCache(None, 4096, max_bytes=2500)
    for base in (0, 1000):
        keep(cache, list(range(base, base + 100)))
    assert cache.stats()["bytes"] == cache.memory_bytes() == 2000 == sum(e.kv.cache.nbytes for e in cache.entries)
    cache.take(list(range(10)) + [3] * 5, "exact")  # a copy of entry 0's prefix: entry 0 is now the recent one
    keep(cache, list(range(2000, 2100)))
    assert [e.tokens[0] for e in cache.entries] == [0, 2000] and cache.memory_bytes() == 2000
    keep(cache, list(range(3000, 3300)))  # 3000 bytes: larger than the bound, not kept
    assert [e.tokens[0] for e in cache.entries] == [0, 2000]
    keep(cache, list(range(4000, 4200)))  # 2000 bytes: both others go
    assert [e.tokens[0] for e in cache.entries] == [4000] and cache.stats()["entries"] == 1


def test_restore_after_a_cancelled_request():
    cache = PromptCache(1000, 4096)
    keep(cache, list(range(100)))
    got = cache.take(list(range(100)) + [1, 2], "exact")
    cache.restore(list(range(100)) + [1, 2], got)
    assert cache.take(list(range(100)) + [3], "exact").cached == 100
