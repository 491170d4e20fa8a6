"""PromptCache bookkeeping without a model: matching, policies, LRU bound."""
from __future__ import annotations

from specfill.core.runtime import KVState
from specfill.serve.prompt_cache import PromptCache, Reuse


def dense(n: int) -> KVState:
    return KVState(object(), n)


def test_exact_reuse_and_truncation():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(100)), dense(99), prompt_tokens=80, method="full", reuse=Reuse(), policy="exact")
    got = cache.take(list(range(90)) + [7, 7, 7], "exact")  # shares 90 of 100 tokens
    assert got.hit and got.cached == 90 and got.state.slots == 90 and got.exact
    assert cache.entries == []  # taken out: the request extends it in place


def test_whole_prompt_cached_leaves_one_token_to_prefill():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(50)), dense(50), prompt_tokens=40, method="full", reuse=Reuse(), policy="exact")
    assert cache.take(list(range(50)), "exact").cached == 49


def test_small_overlap_is_a_miss_and_keeps_the_conversation():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(100)), dense(100), prompt_tokens=90, method="full", reuse=Reuse(), policy="exact")
    assert not cache.take(list(range(30)) + [999] * 80, "exact").hit  # a shared system prompt only
    assert len(cache.entries) == 1 and not cache.take(list(range(100)), "off").hit


def test_long_new_prompt_after_a_short_conversation_is_a_miss():
    """A short conversation sharing a system prompt must not turn a long new prompt (asking for a
    sparse method) into a mostly uncached full prefill."""
    cache = PromptCache(1000, 4096)
    cache.put(list(range(40)), dense(40), prompt_tokens=30, method="full", reuse=Reuse(), policy="exact")
    assert not cache.take(list(range(30)) + [999] * 500, "exact").hit
    assert cache.take(list(range(40)) + [999] * 20, "exact").cached == 40


def test_sparse_conversation_is_rebuilt_under_exact():
    cache = PromptCache(1000, 4096)
    sparse = KVState(object(), 12, 88)  # 10 kept of 100 prompt tokens + 2 generated
    cache.put(list(range(103)), sparse, prompt_tokens=100, method="specprefill", reuse=Reuse(), policy="exact")
    entry = cache.entries[0]
    assert entry.kv is None and entry.rebuilding and cache.pending() is entry
    assert cache.stats()["pending_tokens"] == 103
    got = cache.take(list(range(103)) + [5], "exact")
    assert got.hit and got.state is None and got.cached == 0  # the request prefills it all, densely


def test_sparse_conversation_kept_under_approximate():
    cache = PromptCache(1000, 4096)
    sparse = KVState(object(), 12, 88)
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


def test_lru_bound():
    cache = PromptCache(250, 4096)
    for base in (0, 1000, 2000):
        cache.put(list(range(base, base + 100)), dense(100), prompt_tokens=90, method="full", reuse=Reuse(),
                  policy="exact")
    assert [e.tokens[0] for e in cache.entries] == [1000, 2000]  # the oldest went
    cache.put(list(range(5000, 5300)), dense(300), prompt_tokens=290, method="full", reuse=Reuse(), policy="exact")
    assert [e.tokens[0] for e in cache.entries] == [1000, 2000]  # larger than the bound: not kept


def test_restore_after_a_cancelled_request():
    cache = PromptCache(1000, 4096)
    cache.put(list(range(100)), dense(100), prompt_tokens=90, method="full", reuse=Reuse(), policy="exact")
    got = cache.take(list(range(100)) + [1, 2], "exact")
    cache.restore(list(range(100)) + [1, 2], got)
    assert cache.take(list(range(100)) + [3], "exact").cached == 100
