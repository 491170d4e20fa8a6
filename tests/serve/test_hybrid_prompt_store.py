"""A hybrid model's conversation in the prompt cache's disk store (tiny random Qwen3.5 layout,
float32, on both backends: mlx-lm's on MLX's CPU, transformers' qwen3_5_text on the torch backend's
CPU): the file holds the attention layers' KV up to the last prompt end and the recurrent state
there; a restarted cache reuses exactly that prefix and answers as a cold run; a file whose
recurrent part is missing, inconsistent or another layout's is a miss with one log line, never a
crash or a partial reuse."""

from __future__ import annotations

import json
import logging
import os
import struct

import pytest

from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.serve import prompt_store
from specfill.serve.prompt_cache import PromptCache
from specfill.serve.prompt_store import PromptStore
from tests.adapters.support import prompt

NAME = "tiny-qwen3_5"


@pytest.fixture(scope="module", params=["mlx", "torch"])
def model(request):
    """The four-layer tiny hybrid (recurrent, attention, recurrent, attention) of each backend."""
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
        from tests.adapters.mlx_archs import HYBRID, build
        from tests.adapters.mlx_backend import adapted

        return adapted(build("qwen3_5", dict(HYBRID["qwen3_5"], num_hidden_layers=4)))
    pytest.importorskip("transformers")
    from tests.adapters.torch_archs import HYBRID, build
    from tests.adapters.torch_backend import adapted

    return adapted(build("qwen3_5_text", dict(HYBRID["qwen3_5_text"], num_hidden_layers=4)))


def greedy(model, ids, n=6, reuse=None):
    info = GenerationInfo()
    options = dict(sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod("full"), info=info)
    return list(model.generate_step(ids, max_tokens=n, reuse=reuse, **options)), info


def turn(model, cache, ids, n=6):
    reuse = cache.take(ids, "exact")
    out, info = greedy(model, ids, n, reuse.state)
    cache.put(ids + out, info.kv, prompt_tokens=len(ids), method="full", reuse=reuse, policy="exact")
    return out, reuse


def store_for(model, directory, name=NAME):
    return PromptCache(None, model.args.max_position_embeddings, 10**9, PromptStore(directory, model, name, 10**9))


def saved_conversation(model, directory, seed=1):
    """A first turn written to `directory`; (its prompt, its reply, the file's name)."""
    cache = store_for(model, directory)
    first = prompt(30, seed=seed)
    out, _ = turn(model, cache, first)
    cache.idle_step(model)
    (name,) = os.listdir(directory)
    return first, out, name


def test_a_restarted_cache_reuses_the_prompt_end_and_equals_a_cold_run(model, tmp_path):
    first, out, name = saved_conversation(model, tmp_path)
    header = read_meta(tmp_path / name)
    assert header["slots"] == str(len(first))  # the KV stops at the prompt's end: the mark
    layout = json.loads(header["hybrid"])
    assert (layout["slots"], layout["attention"], layout["recurrent"]) == (len(first), [1, 3], [0, 2])
    restarted = store_for(model, tmp_path)
    assert [e.whole and e.stored == len(first) and e.kv is None for e in restarted.entries] == [True]
    second = first + out + prompt(8, seed=2)
    got, reuse = turn(model, restarted, second)
    assert reuse.hit and reuse.cached == len(first) and got == greedy(model, second)[0]
    restarted.idle_step(model)  # the longer conversation, at its own prompt end, replaces the file
    (name,) = os.listdir(tmp_path)
    assert read_meta(tmp_path / name)["slots"] == str(len(second))
    edited = second[:20] + prompt(15, seed=3)  # shares less than the file's one point: a miss, kept
    again = store_for(model, tmp_path)
    assert not again.take(edited, "exact").hit and again.entries[0].kv is None and os.listdir(tmp_path)


def read_meta(path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])["__metadata__"]


def rewrite_meta(path, change) -> None:
    """The file with its header's metadata changed by `change(meta)` (sizes kept consistent, the
    content hash made again: the file is whole, only its recurrent part is wrong)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    change(header["__metadata__"])
    header["__metadata__"]["content"] = prompt_store.UNSEALED
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])
    prompt_store.seal(path)


def lose_recurrent(meta):
    del meta["hybrid"]


def wrong_slot(meta):
    layout = json.loads(meta["hybrid"])
    meta["hybrid"] = json.dumps(dict(layout, slots=layout["slots"] - 1))


def wrong_shape(meta):
    layout = json.loads(meta["hybrid"])
    layout["states"][0][0][0][-1] += 1
    meta["hybrid"] = json.dumps(layout)


def other_layers(meta):
    layout = json.loads(meta["hybrid"])
    meta["hybrid"] = json.dumps(dict(layout, recurrent=[0, 1]))


@pytest.mark.parametrize("change", [lose_recurrent, wrong_slot, wrong_shape, other_layers])
def test_a_file_with_a_missing_or_inconsistent_recurrent_part_is_a_miss(model, tmp_path, caplog, change):
    first, out, name = saved_conversation(model, tmp_path, seed=4)
    rewrite_meta(tmp_path / name, change)
    second = first + out + [7]
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        cache = store_for(model, tmp_path)
        reuse = cache.take(second, "exact")
    assert not reuse.hit and cache.entries == []
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1 and "skipping" in lines[0] and "content hash" not in lines[0], lines
    assert greedy(model, second)[0]  # the model still serves


def test_a_foreign_file_is_skipped_and_a_file_cut_after_listing_is_a_miss(model, tmp_path, caplog):
    first, out, name = saved_conversation(model, tmp_path, seed=5)
    other = store_for(model, tmp_path, name="another-hybrid")
    turn(model, other, first)  # the same tokens, another model's name: never reused here
    other.idle_step(model)
    assert len(os.listdir(tmp_path)) == 2
    cache = store_for(model, tmp_path)
    assert [e.path for e in cache.entries] == [str(tmp_path / name)]
    data = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(data[: len(data) // 2])  # cut after the scan read its header
    with caplog.at_level(logging.WARNING, logger="specfill.serve"):
        reuse = cache.take(first + out + [9], "exact")
    assert not reuse.hit and cache.entries == [] and not (tmp_path / name).exists()
    assert sum(name in r.getMessage() for r in caplog.records) == 1


def test_an_entry_evicted_to_disk_is_read_back_in_the_same_process(model, tmp_path):
    cache = store_for(model, tmp_path)
    first = prompt(30, seed=7)
    out, _ = turn(model, cache, first)
    cache.idle_step(model)
    cache.max_bytes = 1  # nothing fits in memory: the conversation lives on disk only
    cache._evict()
    assert [(e.kv, e.stored, e.whole) for e in cache.entries] == [(None, len(first), True)]
    cache.max_bytes = 10**9
    second = first + out + [11, 12]
    got, reuse = turn(model, cache, second)
    assert reuse.cached == len(first) and got == greedy(model, second)[0]
