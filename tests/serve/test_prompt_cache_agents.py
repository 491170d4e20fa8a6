"""The prompt cache for agents on a tiny random model, both backends: KV caches' books (nbytes,
copy), LRU by memory, longest-prefix reuse across conversations (a shared system prompt) equal to a
cold run, and the disk store (a restart reuses a saved entry; foreign, corrupt and half-written
files are skipped)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from specfill import load
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from specfill.serve.prompt_cache import WRITE_AFTER_S, PromptCache, Reuse
from specfill.serve.prompt_store import PromptStore

FULL = PrefillMethod("full")
NAME = "random:tiny-llama"


@pytest.fixture(scope="module", params=["cuda", "mlx"])
def model(request):
    pytest.importorskip("torch" if request.param == "cuda" else "mlx.core")
    if request.param == "cuda":
        import torch

        torch.set_num_threads(1)
        return load(NAME, backend="cuda", device="cpu", dtype="float32")[0]
    return load(NAME, backend="mlx", dtype="float32")[0]


def greedy(model, ids: list[int], n: int = 6, reuse: KVState | None = None) -> tuple[list[int], GenerationInfo]:
    info = GenerationInfo()
    out = list(
        model.generate_step(
            ids, max_tokens=n, sampling=SamplingConfig(), stop_ids=frozenset(), method=FULL, info=info, reuse=reuse
        )
    )
    return out, info


def turn(model, cache: PromptCache, ids: list[int], n: int = 6) -> tuple[list[int], Reuse]:
    """One request as the engine runs it: take, generate, put."""
    reuse = cache.take(ids, "exact")
    out, info = greedy(model, ids, n, reuse.state)
    cache.put(ids + out, info.kv, prompt_tokens=len(ids), method="full", reuse=reuse, policy="exact")
    return out, reuse


def host_keys(cache, slots: int) -> np.ndarray:
    every = cache.keys(slots)
    return every.float().numpy() if hasattr(every, "float") else np.asarray(every)


def tokens(model, seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(4, model.args.vocab_size, n).tolist()


def slot_bytes(model) -> int:
    """Keys and values of one slot, every layer, float32."""
    a = model.args
    return 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim * 4


def test_copy_is_independent_and_nbytes_counts_the_buffers(model):
    prompt = tokens(model, 1, 60)
    _, info = greedy(model, prompt)
    cache = info.kv.cache
    assert cache.nbytes >= slot_bytes(model) * cache.filled
    whole = host_keys(cache, 60)
    copy = cache.copy(30)
    assert copy.filled == 30 and copy is not cache
    positions = copy.nbytes - slot_bytes(model) * 30  # torch: an int64 per slot; MLX: per windowed layer's slot
    assert positions in (0, 30 * 8, 30 * 8 * model.args.num_hidden_layers)
    other = prompt[:30] + tokens(model, 2, 20)
    out, extended = greedy(model, other, reuse=KVState(copy, 30))
    assert out == greedy(model, other)[0]
    np.testing.assert_array_equal(host_keys(cache, 60), whole)  # the source is untouched
    assert cache.filled >= 60 and not np.array_equal(host_keys(extended.kv.cache, 50)[:, :, 30:], whole[:, :, 30:50])


def test_lru_by_memory_counts_the_caches_bytes(model):
    runs = [greedy(model, tokens(model, seed, 40 + 10 * seed)) for seed in range(3)]
    sizes = [info.kv.cache.nbytes for _, info in runs]
    cache = PromptCache(None, model.args.max_position_embeddings, max_bytes=sizes[0] + sizes[1] + sizes[2] - 1)
    for seed, (out, info) in enumerate(runs):
        ids = tokens(model, seed, 40 + 10 * seed)
        cache.put(ids + out, info.kv, prompt_tokens=len(ids), method="full", reuse=Reuse(), policy="exact")
    assert [len(e.tokens) for e in cache.entries] == [56, 66]  # the least recently used went
    assert cache.memory_bytes() == sizes[1] + sizes[2] == sum(e.kv.cache.nbytes for e in cache.entries)
    assert cache.stats()["bytes"] == cache.memory_bytes() and cache.stats()["entries"] == 2


def test_two_agents_sharing_a_system_prompt(model):
    """Agent B reuses agent A's system prompt (a copy); A's next turn reuses all of A's
    conversation; every reply equals a cold run's (greedy, exact policy)."""
    system = tokens(model, 10, 80)
    a, b = system + tokens(model, 11, 100), system + tokens(model, 12, 120)
    cache = PromptCache(None, model.args.max_position_embeddings, max_bytes=10**9)
    out_a, miss = turn(model, cache, a)
    assert not miss.hit
    out_b, shared = turn(model, cache, b)
    assert shared.copied and shared.cached == 80 and out_b == greedy(model, b)[0]
    a2 = a + out_a + tokens(model, 13, 15)
    out_a2, own = turn(model, cache, a2)
    assert not own.copied and own.cached >= len(a) + len(out_a) - 1 and out_a2 == greedy(model, a2)[0]
    b2 = b + out_b + tokens(model, 14, 5)
    out_b2, own_b = turn(model, cache, b2)
    assert own_b.cached >= len(b) and out_b2 == greedy(model, b2)[0]
    assert len(cache.entries) == 2 and cache.hits == 3 and cache.copies == 1


def store_for(model, directory, name: str = NAME) -> PromptCache:
    return PromptCache(None, model.args.max_position_embeddings, 10**9, PromptStore(directory, model, name, 10**9))


def test_a_restarted_cache_reuses_the_saved_entry(model, tmp_path):
    cache = store_for(model, tmp_path)
    prompt = tokens(model, 20, 70)
    out, _ = turn(model, cache, prompt)
    assert cache.has_idle_work()  # written after the response, in idle time: once the server was quiet
    assert WRITE_AFTER_S / 2 < cache.idle_delay() <= WRITE_AFTER_S  # for WRITE_AFTER_S (the next turn first)
    cache.idle_step(model)
    assert not cache.has_idle_work() and len(os.listdir(tmp_path)) == 1
    restarted = store_for(model, tmp_path)
    assert restarted.stats()["disk_entries"] == 1 and restarted.stats()["entries"] == 0
    follow = prompt + out + tokens(model, 21, 10)
    out2, reuse = turn(model, restarted, follow)
    assert reuse.cached >= len(prompt) and out2 == greedy(model, follow)[0]
    restarted.idle_step(model)  # the longer conversation replaces the file it came from
    assert len(os.listdir(tmp_path)) == 1 and restarted.stats()["disk_entries"] == 1


def test_foreign_and_corrupt_files_are_skipped(model, tmp_path, caplog):
    other = store_for(model, tmp_path, name="some/other-model")
    turn(model, other, tokens(model, 30, 40))
    other.idle_step(model)
    (good,) = os.listdir(tmp_path)
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    data = (tmp_path / good).read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        cache = store_for(model, tmp_path)
    assert cache.entries == []
    lines = [r.getMessage() for r in caplog.records]
    assert sum("another model" in line for line in lines) == 1
    assert any("junk.safetensors" in line for line in lines) and any("cut.safetensors" in line for line in lines)
    prompt = tokens(model, 30, 40)
    assert not cache.take(prompt, "exact").hit  # the other model's conversation is not reused


def test_a_file_broken_after_listing_is_a_miss(model, tmp_path, caplog):
    cache = store_for(model, tmp_path)
    prompt = tokens(model, 40, 50)
    out, _ = turn(model, cache, prompt)
    cache.idle_step(model)
    (name,) = os.listdir(tmp_path)
    restarted = store_for(model, tmp_path)
    (tmp_path / name).write_bytes(b"garbage")  # broken after the header was read at startup
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        reuse = restarted.take(prompt + out + [5], "exact")
    assert not reuse.hit and restarted.entries == [] and any("skipping" in r.getMessage() for r in caplog.records)


def test_a_failed_write_leaves_no_file(model, tmp_path, monkeypatch, caplog):
    cache = store_for(model, tmp_path)
    out, _ = turn(model, cache, tokens(model, 50, 30))
    kind = type(cache.entries[0].kv.cache)

    def half_then_fail(self, path, slots, metadata):
        with open(path, "wb") as f:
            f.write(b"\x00" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kind, "save", half_then_fail)
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        cache.idle_step(model)
    assert os.listdir(tmp_path) == []
    assert cache.entries[0].kv is not None and cache.entries[0].unsaved and not cache.has_idle_work()
    assert any("No space left" in r.getMessage() for r in caplog.records)


def test_reference_cache_books_and_files(tmp_path):
    """The NumPy reference KVCache: nbytes, copy, save and load (the protocol's executable spec)."""
    from specfill.core.reference.kv_cache import ReferenceKVCache

    rng = np.random.default_rng(0)
    cache = ReferenceKVCache(2, 3, 4, 10)
    assert cache.nbytes == 2 * 2 * 3 * 10 * 4 * 8  # float64, every reserved slot
    for layer in cache.layers:
        layer.update_and_fetch(rng.normal(size=(1, 3, 6, 4)), rng.normal(size=(1, 3, 6, 4)))
    copy = cache.copy(4, 8)
    assert copy.filled == 4 and copy.capacity == 8 and copy.nbytes == cache.nbytes * 8 // 10
    copy.layers[0].update_and_fetch(np.ones((1, 3, 2, 4)), np.ones((1, 3, 2, 4)))
    assert not np.array_equal(copy.keys(6)[0], cache.keys(6)[0])  # its own memory
    np.testing.assert_array_equal(copy.keys(4), cache.keys(4))
    cache.save(str(tmp_path / "c.safetensors"), 5, {"format": "test"})
    back = ReferenceKVCache(2, 3, 4, 5)
    assert back.load(str(tmp_path / "c.safetensors")) == 5 and back.filled == 5
    np.testing.assert_array_equal(back.keys(5), cache.keys(5))
    with pytest.raises(ValueError):
        ReferenceKVCache(2, 2, 4, 5).load(str(tmp_path / "c.safetensors"))  # other heads
    with pytest.raises(ValueError):
        cache.copy(7)  # more than it holds


def test_a_backend_cache_refuses_a_file_of_another_shape(model, tmp_path):
    _, info = greedy(model, tokens(model, 60, 20))
    path = str(tmp_path / "kv.safetensors")
    info.kv.cache.save(path, 20, {"format": "test"})
    fresh = model.ops.new_cache(model.model, 20)
    assert fresh.load(path) == 20
    np.testing.assert_array_equal(host_keys(fresh, 20), host_keys(info.kv.cache, 20))
    with pytest.raises(ValueError):
        model.ops.new_cache(model.model, 10).load(path)  # no room for its slots


def test_the_disk_store_is_bounded_oldest_first(model, tmp_path):
    cache = store_for(model, tmp_path)
    out, _ = turn(model, cache, tokens(model, 70, 40))
    cache.idle_step(model)
    (first,) = os.listdir(tmp_path)
    size = (tmp_path / first).stat().st_size
    cache.store.max_bytes = size + size // 2  # room for one file of this size only
    os.utime(tmp_path / first, (1, 1))  # unmistakably the oldest
    cache.max_bytes = 1  # and nothing in memory: the first conversation lives on disk only
    cache._evict()
    assert [e.kv for e in cache.entries] == [None] and cache.stats()["disk_entries"] == 1
    cache.max_bytes = 10**9
    turn(model, cache, tokens(model, 71, 40))
    cache.idle_step(model)
    assert first not in os.listdir(tmp_path) and len(os.listdir(tmp_path)) == 1
    assert len(cache.entries) == 1 and cache.stats()["disk_entries"] == 1  # the disk-only one is gone
    assert cache.stats()["disk_bytes"] <= cache.store.max_bytes


def engine_turn(engine, ids: list[int], method: str = "full", policy: str = "exact"):
    """One request through the server's Engine (greedy, 6 tokens): (Started, Finished, its text)."""
    from specfill.core.config import H2OConfig
    from specfill.core.request import build_request
    from specfill.serve.engine import Delta, Finished, Started
    from specfill.serve.plan import Plan

    h2o = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=0) if method == "h2o" else None
    job = Plan(
        kind="completion",
        ids=ids,
        request=build_request(max_tokens=6, method=method, h2o=h2o),
        method_name=method,
        stops=[],
        stream=False,
        include_usage=False,
        return_progress=False,
        prompt_cache=policy,
    )
    events: list = []
    engine.run(job, events.append)
    started = next(e for e in events if isinstance(e, Started))
    return (
        started,
        events[-1] if isinstance(events[-1], Finished) else None,
        "".join(e.text for e in events if isinstance(e, Delta)),
    )


def test_the_engine_reuses_a_shared_prefix_and_keeps_sparse_requests_sparse(model):
    """Through the server's Engine: a second conversation reuses the first's system prompt (a copy,
    the same reply as without the cache); an H2O request reuses it too and walks the rest by H2O
    (docs/methods.md, H2O from a reused prefix); so does an auto request, however short the prefix."""
    from specfill import load as load_pair
    from specfill.api import Session
    from specfill.serve.engine import Engine

    _, tokenizer = load_pair(
        NAME,
        backend=model.backend,
        **({"device": "cpu", "dtype": "float32"} if model.backend == "cuda" else {"dtype": "float32"}),
    )
    engine = Engine(Session(model, tokenizer), PromptCache(None, model.args.max_position_embeddings, 10**9))
    system = tokens(model, 80, 64)
    engine_turn(engine, system + tokens(model, 81, 100))
    started, finished, reply = engine_turn(engine, system + tokens(model, 82, 90))
    assert started.cached == finished.cached_tokens == 64 and finished.stats["prefill_method"] == "full"
    assert reply == engine_turn(engine, system + tokens(model, 82, 90), policy="off")[2]
    assert engine.cache.copies == 1 and engine.health()["prompt_cache"]["entries"] == 2
    _, sparse, _ = engine_turn(engine, system + tokens(model, 83, 200), method="h2o")
    assert sparse.cached_tokens == 64 and sparse.stats["prefill_method"] == "h2o"
    _, auto, _ = engine_turn(engine, system + tokens(model, 84, 200), method="auto")  # full below the crossover
    assert auto.cached_tokens == 64 and auto.stats["prefill_method"] == "full"


def test_an_h2o_turn_over_a_cached_conversation(model):
    """Turn 2 of a conversation asks for H2O: it reuses turn 1's whole dense conversation and walks
    only its new part by H2O (the reply is generate_step(reuse=..., method=h2o)'s); under the exact
    policy the new part is rebuilt densely in idle time from the reused prefix on (kept), and turn 3
    reuses the whole conversation."""
    from specfill import load as load_pair
    from specfill.api import Session
    from specfill.core.config import H2OConfig
    from specfill.serve.engine import Engine

    _, tokenizer = load_pair(
        NAME,
        backend=model.backend,
        **({"device": "cpu", "dtype": "float32"} if model.backend == "cuda" else {"dtype": "float32"}),
    )
    engine = Engine(Session(model, tokenizer), PromptCache(None, model.args.max_position_embeddings, 10**9))
    first = tokens(model, 90, 70)
    engine_turn(engine, first)
    (entry,) = engine.cache.entries
    conversation = entry.tokens + tokens(model, 91, 60)
    prefix_kv = KVState(entry.kv.cache.copy(entry.kv.slots), entry.kv.slots)  # what turn 2 will reuse
    started, done, _ = engine_turn(engine, conversation, method="h2o")
    assert started.cached == done.cached_tokens == prefix_kv.tokens and done.stats["prefill_method"] == "h2o"
    h2o = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=0))
    info = GenerationInfo()
    want = list(
        model.generate_step(
            conversation,
            max_tokens=6,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=h2o,
            info=info,
            reuse=prefix_kv,
        )
    )
    (entry,) = engine.cache.entries
    assert entry.tokens == conversation + want
    assert entry.rebuilding and entry.covered == prefix_kv.tokens  # the dense prefix is kept
    while engine.has_idle_work():
        engine.idle_step()
    assert not entry.rebuilding and entry.exact
    started, done, _ = engine_turn(engine, entry.tokens + tokens(model, 92, 5))
    assert started.cached == len(conversation) + len(want)
