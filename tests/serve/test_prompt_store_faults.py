"""The prompt cache's disk store under faults (serve/prompt_store.py): a writer killed with SIGKILL
at random moments leaves only whole files, each read back as written, and no temporary file once a
store is opened again; a byte changed on disk is never served (the content hash); a full disk is one
log line and serving goes on; a read-only directory, files of another specfill version: one line
each; and the memory bound holds over a hundred conversations."""

from __future__ import annotations

import errno
import gc
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest

from specfill import load
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.serve import prompt_store
from specfill.serve.prompt_cache import PromptCache
from specfill.serve.prompt_store import TEMP, PromptStore
from tests.serve import store_writer

TRIALS = 24
NAME = "random:tiny-llama"


@pytest.fixture(scope="module", params=["cuda", "mlx"])
def pair(request):
    """The tiny random model and its tokenizer on each backend (float32, CPU)."""
    pytest.importorskip("torch" if request.param == "cuda" else "mlx.core")
    if request.param == "cuda":
        import torch

        torch.set_num_threads(1)
        return load(NAME, backend="cuda", device="cpu", dtype="float32")
    return load(NAME, backend="mlx", dtype="float32")


@pytest.fixture(scope="module")
def model(pair):
    return pair[0]


def tokens(model, seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(4, model.args.vocab_size, n).tolist()


def greedy(model, ids: list[int], reuse=None) -> tuple[list[int], GenerationInfo]:
    info = GenerationInfo()
    options = dict(sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod("full"), info=info)
    return list(model.generate_step(ids, max_tokens=4, reuse=reuse, **options)), info


def turn(model, cache: PromptCache, ids: list[int]):
    """One request as the engine runs it (take, generate, put), then the idle step writing it."""
    reuse = cache.take(ids, "exact")
    out, info = greedy(model, ids, reuse.state)
    cache.put(ids + out, info.kv, prompt_tokens=len(ids), method="full", reuse=reuse, policy="exact")
    while cache.has_idle_work():
        cache.idle_step(model)
    return out, reuse


def store_for(model, directory) -> PromptCache:
    return PromptCache(None, model.args.max_position_embeddings, 10**9, PromptStore(directory, model, NAME, 10**9))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def temporaries(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(TEMP))


def test_sigkill_while_writing_leaves_only_whole_files_and_no_temporaries(tmp_path, caplog):
    """TRIALS writer processes, one after another on one directory, each killed with SIGKILL after a
    random delay while it writes (and, its bound reached, deletes) entries; after each, a store
    opened on the directory lists every file, reads each back equal to what was written, and leaves
    no temporary file."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.serve.store_writer"])
    pick = random.Random(48)
    model, max_bytes = store_writer.ReferenceModel(), 8 << 20
    caught, files, checked, trial = 0, set(), 0, -1
    # TRIALS kills at least; more (up to 3x) until a quarter of TRIALS landed mid-write, which a
    # loaded machine (its writers slowed) may need
    while trial + 1 < TRIALS or (caught < TRIALS // 4 and trial + 1 < 3 * TRIALS):
        trial += 1
        ready = context.Event()
        writer = context.Process(target=store_writer.write_forever, args=(str(tmp_path), trial, max_bytes, ready))
        writer.start()
        assert ready.wait(60), "the writer did not start"
        time.sleep(pick.uniform(0.0, 0.25))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
        assert writer.exitcode == -signal.SIGKILL, f"trial {trial}: the writer ended by itself ({writer.exitcode})"
        caught += bool(temporaries(tmp_path))  # killed mid-write: its temporary file is there
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="specfill.serve"):
            store = PromptStore(tmp_path, model, store_writer.NAME, max_bytes)
            entries = store.scan()
        assert temporaries(tmp_path) == [], f"trial {trial}"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], f"trial {trial}"
        assert sorted(e.path for e in entries) == sorted(str(p) for p in store.files()), f"trial {trial}"
        for entry in entries:  # every file served equals what was written
            kv = store.load(entry)
            keys, values = store_writer.content(entry.tokens)
            np.testing.assert_array_equal(kv.cache.keys(kv.slots), keys)
            np.testing.assert_array_equal(np.stack([layer.v[0] for layer in kv.cache.layers]), values)
            checked += 1
        files.update(e.path for e in entries)
    assert caught >= TRIALS // 4, f"only {caught} of {trial + 1} kills landed in a write"
    assert len(files) > TRIALS and checked > 2 * TRIALS


def test_a_byte_changed_on_disk_is_never_served(model, tmp_path, caplog):
    """A file whose header still reads well but one byte of its KV changed: listed at startup, then
    a miss when a prompt would reuse it (the content hash), with one line naming it; the request is
    answered as a cold run."""
    first = tokens(model, 1, 60)
    out, _ = turn(model, store_for(model, tmp_path), first)
    (name,) = os.listdir(tmp_path)
    data = bytearray((tmp_path / name).read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    data[8 + length + (len(data) - 8 - length) // 3] ^= 0x40  # an exponent bit of a key or value
    (tmp_path / name).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        cache = store_for(model, tmp_path)
        assert len(cache.entries) == 1 and caplog.records == []
        second = first + out + tokens(model, 2, 5)
        reply, reuse = turn(model, cache, second)
    assert not reuse.hit and reply == greedy(model, second)[0]
    (line,) = warnings_of(caplog)
    assert name in line and "content hash mismatch" in line
    assert name not in os.listdir(tmp_path)  # dropped (the conversation's own file replaced it)


def test_a_write_is_flushed_before_its_rename_and_the_directory_after(model, tmp_path, monkeypatch):
    cache = store_for(model, tmp_path)
    events = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd):
        events.append("fsync directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        fsync(fd)

    def recorded_replace(source, target):
        events.append("replace " + ("temporary" if str(source).endswith(TEMP) else str(source)))
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    turn(model, cache, tokens(model, 3, 30))
    assert events == ["fsync file", "replace temporary", "fsync directory"]
    (name,) = os.listdir(tmp_path)
    meta = prompt_store.read_header(tmp_path / name)
    assert meta["content"].startswith("sha256:") and meta["content"] != prompt_store.UNSEALED
    prompt_store.check_content(tmp_path / name, meta)


def test_temporary_files_of_gone_writers_are_deleted_at_startup(model, tmp_path, caplog):
    """Temporary files of a process that is gone or of this process (a previous life under the same
    id) are deleted when a store opens the directory; one of a running process is its write in
    progress and stays."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = {pid: f".{'ab' * 16}.{pid}{TEMP}" for pid in (gone.pid, os.getpid(), os.getppid())}
    for name in names.values():
        (tmp_path / name).write_bytes(b"half a file")
    with caplog.at_level(logging.INFO, logger="specfill.serve"):
        store_for(model, tmp_path)
    assert os.listdir(tmp_path) == [names[os.getppid()]]
    assert [r.getMessage() for r in caplog.records] == [
        f"prompt cache: deleted 2 temporary file(s) of an interrupted write in {tmp_path}"
    ]


class DiskFull:
    """An injected ENOSPC: in the backend's write (half a file written first) or in the fsync."""

    def __init__(self, monkeypatch, cache: PromptCache, where: str):
        self.monkeypatch, self.where, self.kind = monkeypatch, where, type(cache.entries[0].kv.cache)

    def __enter__(self):
        if self.where == "write":

            def half_then_full(cache, path, slots, metadata):
                with open(path, "wb") as f:
                    f.write(b"\x00" * 100)
                raise OSError(errno.ENOSPC, "No space left on device")

            self.monkeypatch.setattr(self.kind, "save", half_then_full)
        else:

            def full(fd):
                raise OSError(errno.ENOSPC, "No space left on device")

            self.monkeypatch.setattr(os, "fsync", full)

    def __exit__(self, *exc):
        self.monkeypatch.undo()


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_a_full_disk_is_one_line_and_serving_goes_on(model, tmp_path, monkeypatch, caplog, where):
    """Three conversations while the disk is full: one log line, no file, each answered as a cold
    run and kept in memory; once there is room, the next conversation is written (one line says so)."""
    cache = store_for(model, tmp_path)
    turn(model, cache, tokens(model, 10, 20))  # written: the disk had room
    with caplog.at_level(logging.INFO, logger="specfill.serve"), DiskFull(monkeypatch, cache, where):
        for seed in (11, 12, 13):
            prompt = tokens(model, seed, 30 + seed)
            reply, _ = turn(model, cache, prompt)
            assert reply == greedy(model, prompt)[0]
        assert len(os.listdir(tmp_path)) == 1 and temporaries(tmp_path) == []
        assert [e.unsaved and e.kv is not None for e in cache.entries] == [False, True, True, True]
        lines = warnings_of(caplog)
        assert len(lines) == 1 and "No space left on device" in lines[0], lines
    with caplog.at_level(logging.INFO, logger="specfill.serve"):
        turn(model, cache, tokens(model, 14, 25))
    assert len(os.listdir(tmp_path)) == 2 and temporaries(tmp_path) == []
    assert [r.getMessage() for r in caplog.records][1:] == [f"prompt cache: writing to {tmp_path} again"]
    again = store_for(model, tmp_path)
    assert all(again.store.load(e).slots for e in again.entries)


@pytest.fixture
def tmpfs(tmp_path):
    """A 192 KiB tmpfs (needs root and mount: else the test is skipped)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    point = tmp_path / "tmpfs"
    point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(point)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    yield point
    subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_real_full_disk_is_one_line_and_serving_goes_on(model, tmpfs, caplog):
    """Conversations of about 64 KiB each on a 192 KiB tmpfs: the first fit, then the device is
    full (ENOSPC from the backend's own writer): one line, nothing half-written, every reply a cold
    run's."""
    cache = store_for(model, tmpfs)
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        for seed in range(6):
            prompt = tokens(model, 20 + seed, 120)
            reply, _ = turn(model, cache, prompt)
            assert reply == greedy(model, prompt)[0]
    assert 0 < cache.saved < 6 and temporaries(tmpfs) == []
    assert sum(e.unsaved for e in cache.entries) == 6 - cache.saved
    lines = warnings_of(caplog)  # torch's writer says "No space left on device", MLX's "Unable to write"
    assert len(lines) == 1 and " KiB free there: " in lines[0], lines
    again = store_for(model, tmpfs)
    assert len(again.entries) == cache.saved and all(again.store.load(e).slots for e in again.entries)


def read_only(directory) -> None:
    """Make `directory` read only for this process: its mode (not binding on root), else a
    remount of its tmpfs (the caller mounted one)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True, capture_output=True)


def test_a_read_only_directory_is_read_and_never_written(model, request, tmp_path, caplog):
    """Its conversations are reused, a broken file in it is skipped with one line (and stays),
    nothing new is written or tried: one line says so at startup."""
    directory = request.getfixturevalue("tmpfs") if os.geteuid() == 0 else tmp_path / "store"
    first = tokens(model, 30, 50)
    out, _ = turn(model, store_for(model, directory), first)
    (good,) = os.listdir(directory)
    (directory / "cut.safetensors").write_bytes((directory / good).read_bytes()[:-10])
    read_only(directory)
    try:
        with caplog.at_level(logging.WARNING, logger="specfill.serve"):
            cache = store_for(model, directory)
            second = first + out + tokens(model, 31, 6)
            reply, reuse = turn(model, cache, second)
            turn(model, cache, tokens(model, 32, 40))
    finally:
        if os.geteuid() != 0:
            directory.chmod(0o755)
    assert reuse.hit and reuse.cached >= len(first) and reply == greedy(model, second)[0]
    assert sorted(os.listdir(directory)) == sorted([good, "cut.safetensors"])
    lines = warnings_of(caplog)
    assert len(lines) == 2 and "read only" in lines[0] and "cut.safetensors" in lines[1], lines
    assert not cache.has_idle_work() and cache.stats()["saved"] == 0


def test_files_of_another_specfill_version_are_skipped_with_one_line(model, tmp_path, caplog):
    """Two files as a version without content hashes wrote them: one line for both, kept on disk."""
    cache = store_for(model, tmp_path)
    for seed in (40, 41):
        turn(model, cache, tokens(model, seed, 30))
    for name in os.listdir(tmp_path):
        data = (tmp_path / name).read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        header["__metadata__"]["format"] = "specfill-prompt-cache/1"
        del header["__metadata__"]["content"]
        raw = json.dumps(header).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        again = store_for(model, tmp_path)
    assert again.entries == [] and len(os.listdir(tmp_path)) == 2
    (line,) = warnings_of(caplog)
    assert "another specfill version (format specfill-prompt-cache/1" in line


@pytest.mark.parametrize("background", [False, True], ids=["worker-writes", "background-writes"])
def test_the_memory_bound_holds_over_a_hundred_and_twenty_conversations(pair, tmp_path, background):
    """120 requests through the server's Engine (84 conversations; every third request is a second
    turn of one begun 4 or 11 requests before, the latter often gone from memory to disk), with the
    memory bound (--cache-memory) room for about six and a disk store: after every request the kept
    KV's bytes are within the bound, and no KV cache the prompt cache let go is still alive (nothing
    else holds one). With background writes (the torch backend's) as with the worker's own."""
    from specfill.api import Session
    from specfill.serve.engine import Engine
    from tests.serve.test_prompt_cache_agents import engine_turn

    model, tokenizer = pair
    if background and model.backend == "mlx":
        pytest.skip("the MLX backend writes on the worker (Backend.threaded_writes)")
    probe = Engine(Session(model, tokenizer), PromptCache(None, model.args.max_position_embeddings, None))
    engine_turn(probe, tokens(model, 99, 70))
    bound = 6 * probe.cache.entries[0].nbytes  # what the backend reserves for one conversation, six times
    store = PromptStore(tmp_path, model, NAME, 10**9)
    cache = PromptCache(None, model.args.max_position_embeddings, bound, store, background=background)
    engine = Engine(Session(model, tokenizer), cache)
    made: list[weakref.ref] = []
    prompts: dict[int, list[int]] = {}
    seconds = 0
    for n in range(120):
        if n % 3 or n < 12:
            prompts[n] = [4 + n] + tokens(model, 100 + n, 40 + n % 30)  # a first token of its own
        else:  # a first turn's conversation (n - 4 and n - 11 are not multiples of 3)
            begun = n - (4 if n % 2 else 11)
            before, prompts[begun] = prompts[begun], prompts[begun] + [5 + n % 7] * 4
        started, _, _ = engine_turn(engine, prompts[n if n % 3 or n < 12 else begun])
        if not (n % 3 or n < 12):
            seconds += started.cached >= len(before)  # its first turn reused, from memory or disk
        while engine.has_idle_work():
            engine.idle_step()
        made += [weakref.ref(e.kv.cache) for e in cache.entries if e.kv is not None]
        assert cache.memory_bytes() <= bound, n
        assert cache.stats()["bytes"] == sum(e.kv.cache.nbytes for e in cache.entries if e.kv is not None)
    gc.collect()
    kept = {id(e.kv.cache) for e in cache.entries if e.kv is not None}
    alive = {id(c) for r in made if (c := r()) is not None}
    assert alive == kept and 1 < len(kept) <= 6
    assert seconds == 36 and cache.stats()["disk_entries"] == 84
