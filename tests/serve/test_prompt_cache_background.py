"""The prompt cache's background disk writes (serve/cache_writes.py, PromptCache `background`): the writer
thread writes a copy of the conversation, so the next turn is served while the write runs; what the
cache does when the write ends (the conversation taken, evicted, superseded meanwhile; a failure);
the file equal to a synchronous write's; a server's shutdown waits for the write in flight. On the
tiny random model, torch on the CPU (the MLX backend writes on the worker: core/backend.Backend.threaded_writes).
"""

from __future__ import annotations

import errno
import logging
import os
import threading

import numpy as np
import pytest

from specfill import load
from specfill.backends import get_backend
from specfill.serve.cache_writes import snapshot
from specfill.serve.prompt_cache import PromptCache
from specfill.serve.prompt_store import PromptStore
from tests.serve.test_prompt_store_faults import greedy, tokens  # the same tiny model's helpers

NAME = "random:tiny-llama"


@pytest.fixture(scope="module")
def pair():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    return load(NAME, backend="cuda", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def model(pair):
    return pair[0]


def request(model, cache: PromptCache, ids: list[int]):
    """One request as the engine runs it: take, generate, put (no idle work)."""
    reuse = cache.take(ids, "exact")
    out, info = greedy(model, ids, reuse.state)
    cache.put(ids + out, info.kv, prompt_tokens=len(ids), method="full", reuse=reuse, policy="exact")
    return out, reuse


def idle(model, cache: PromptCache) -> None:
    while cache.has_idle_work():
        cache.idle_step(model)


class Gate:
    """store.write held at a gate: the test decides when the writer thread may write."""

    def __init__(self, store: PromptStore, monkeypatch):
        self.open, self.entered, self.threads = threading.Event(), threading.Event(), []
        real = store.write

        def held(entry):
            self.threads.append(threading.current_thread().name)
            self.entered.set()
            assert self.open.wait(30), "the gate was never opened"
            return real(entry)

        monkeypatch.setattr(store, "write", held)


def cache_for(model, directory, background: bool = True, max_bytes: int | None = 10**9) -> PromptCache:
    store = PromptStore(directory, model, NAME, 10**9)
    return PromptCache(None, model.args.max_position_embeddings, max_bytes, store, background=background)


def keys_of(kv) -> np.ndarray:
    return kv.cache.keys(kv.slots).float().numpy()


def test_the_background_file_holds_what_the_synchronous_one_holds(model, tmp_path):
    """The same tensors, bit for bit, and the same header metadata but the content hash (safetensors
    orders a header's metadata as its hash map iterates, so the files' bytes may differ)."""
    from safetensors import safe_open

    ids = tokens(model, 1, 60)
    for background, where in ((False, tmp_path / "sync"), (True, tmp_path / "background")):
        cache = cache_for(model, where, background)
        request(model, cache, ids)
        idle(model, cache)
        assert cache.stats()["saved"] == 1 and cache.writes.writing is None
    (name,) = os.listdir(tmp_path / "sync")
    assert os.listdir(tmp_path / "background") == [name]
    read = []
    for where in ("sync", "background"):
        with safe_open(tmp_path / where / name, framework="pt") as f:
            meta = {k: v for k, v in f.metadata().items() if k != "content"}
            read.append((meta, {key: f.get_tensor(key).numpy() for key in f.keys()}))
    (meta, tensors), (meta_b, tensors_b) = read
    assert meta == meta_b and sorted(tensors) == sorted(tensors_b) == ["keys", "positions", "values"]
    assert all(np.array_equal(tensors[k], tensors_b[k]) for k in tensors)


def test_the_next_turn_is_served_while_the_write_is_held_and_its_file_goes_after(model, tmp_path, monkeypatch):
    """Turn 2 takes the conversation and is answered (as a cold run would) while the writer of turn
    1's copy is held at the gate; when it ends, turn 1's file is deleted (the conversation was taken,
    as a file written before would have been), and turn 2's conversation is written next."""
    cache = cache_for(model, tmp_path)
    gate = Gate(cache.store, monkeypatch)
    first = tokens(model, 2, 50)
    out, _ = request(model, cache, first)
    cache.idle_step(model)  # the write starts, on the writer thread
    assert gate.entered.wait(30) and cache.writes.writing is not None
    assert gate.threads == ["specfill-cache-write_0"]
    second = first + out + tokens(model, 3, 8)
    reply, reuse = request(model, cache, second)  # served with the writer held
    assert reuse.hit and reuse.cached >= len(first) and reply == greedy(model, second)[0]
    assert cache.writes.writing.dropped and cache.has_idle_work()
    gate.open.set()
    idle(model, cache)
    (name,) = os.listdir(tmp_path)
    assert cache.stats()["saved"] == 2 and [e.path for e in cache.entries] == [str(tmp_path / name)]
    again = cache_for(model, tmp_path)
    (entry,) = again.entries
    assert entry.tokens == second + reply
    assert np.array_equal(keys_of(again.store.load(entry)), keys_of(cache.entries[0].kv))


def test_the_copy_is_written_not_the_conversation_changed_meanwhile(model, tmp_path, monkeypatch):
    """The conversation's KV overwritten in place (as a next turn that cuts it back rewrites its last
    slots) while the writer is held: the file holds the keys as they were when the write began."""
    import torch
    from safetensors.torch import load_file

    cache = cache_for(model, tmp_path)
    gate = Gate(cache.store, monkeypatch)
    request(model, cache, tokens(model, 4, 50))
    (entry,) = cache.entries
    before = keys_of(entry.kv).copy()
    cache.idle_step(model)
    assert gate.entered.wait(30)
    with torch.inference_mode():
        entry.kv.cache.k.mul_(-1.0)
    assert not np.array_equal(keys_of(entry.kv), before)
    gate.open.set()
    cache.settle()
    assert entry.path is not None and np.array_equal(load_file(entry.path)["keys"].numpy(), before)


def test_a_conversation_evicted_while_written_stays_on_disk_only(model, tmp_path, monkeypatch):
    probe = PromptCache(None, model.args.max_position_embeddings, None)
    request(model, probe, tokens(model, 6, 40))
    cache = cache_for(model, tmp_path, max_bytes=int(1.5 * probe.entries[0].nbytes))  # room for one
    gate = Gate(cache.store, monkeypatch)
    first = tokens(model, 7, 40)
    out, _ = request(model, cache, first)
    cache.idle_step(model)
    assert gate.entered.wait(30)
    request(model, cache, tokens(model, 8, 40))  # another conversation: the first leaves memory
    assert [e.tokens[:40] for e in cache.entries] == [tokens(model, 8, 40)]
    gate.open.set()
    cache.settle()
    disk = [e for e in cache.entries if e.kv is None]
    assert [e.tokens for e in disk] == [first + out] and disk[0].path is not None
    idle(model, cache)
    reply, reuse = request(model, cache, first + out + tokens(model, 9, 5))  # read back from disk
    assert reuse.hit and reuse.cached >= len(first) and reply == greedy(model, first + out + tokens(model, 9, 5))[0]


def test_a_failed_background_write_is_one_line_and_serving_goes_on(model, tmp_path, monkeypatch, caplog):
    cache = cache_for(model, tmp_path)

    def full(entry):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.store, "write", full)
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        for seed in (10, 11):
            request(model, cache, tokens(model, seed, 30))
            idle(model, cache)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "No space left" in lines[0], lines
    assert [e.unsaved for e in cache.entries] == [True, True] and not cache.has_idle_work()
    assert os.listdir(tmp_path) == []


def test_a_shutdown_waits_for_the_write_in_flight(pair, tmp_path, monkeypatch):
    from specfill.api import Session
    from specfill.serve.engine import Engine

    model = pair[0]
    cache = cache_for(model, tmp_path)
    gate = Gate(cache.store, monkeypatch)
    request(model, cache, tokens(model, 12, 30))
    request(model, cache, tokens(model, 13, 30))
    cache.idle_step(model)
    assert gate.entered.wait(30)
    threading.Timer(0.3, gate.open.set).start()
    Engine(Session(*pair), cache).flush()  # the server's stop
    assert cache.writes.writing is None and cache.stats()["saved"] == 2 and len(os.listdir(tmp_path)) == 2


def test_the_copy_shares_no_memory_with_the_conversation(model, tmp_path):
    import torch

    cache = cache_for(model, tmp_path, background=False)
    request(model, cache, tokens(model, 14, 30))
    (entry,) = cache.entries
    copied = snapshot(entry)
    before = keys_of(copied.kv).copy()
    with torch.inference_mode():
        entry.kv.cache.k.zero_()
    assert copied.tokens == entry.tokens and copied.kv.slots == entry.kv.slots
    assert np.array_equal(keys_of(copied.kv), before) and np.abs(before).sum() > 0


def test_which_backends_write_in_the_background():
    assert get_backend("cuda").threaded_writes and not get_backend("mlx").threaded_writes
