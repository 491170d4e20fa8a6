"""SpecPrefill from a cached conversation in the prompt cache (serve/prompt_cache.py, docs/methods.md):
the entry keeps the speculator's KV beside the main model's, through the exact policy's dense rebuild
(which starts from the dense prefix), in a copy of a shared prefix, and on disk (read back by a
restarted store); the next SpecPrefill turn reuses both and selects only from its new part, as a run
whose speculator reads the whole prompt does."""

from __future__ import annotations

import shutil

import pytest

from specfill.core.config import SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod
from specfill.serve.prompt_cache import PromptCache
from specfill.serve.prompt_store import SPECULATOR, PromptStore
from tests.fixtures.tiny_models import greedy_run, load_tiny, random_tokens

METHOD = PrefillMethod(
    "specprefill",
    specprefill=SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3),
    speculator="self:1",
)


@pytest.fixture(scope="module", params=["cuda", "mlx"])
def model(request):
    return load_tiny(request.param)[0]


tokens = random_tokens


def run(model, ids, reuse=None, read=None):
    return greedy_run(model, ids, METHOD, reuse, read=read)


def settle(cache: PromptCache, model) -> None:
    while cache.has_idle_work():
        cache.idle_step(model)


def test_a_turn_reuses_the_conversation_and_its_speculator_kv_from_memory_and_disk(model, tmp_path):
    store = PromptStore(tmp_path / "a", model, "tiny", None, "self:1", "self:1")
    cache = PromptCache(None, model.args.max_position_embeddings, None, store)
    ids1 = tokens(model, 1, 90)
    miss = cache.take(ids1, "exact")
    assert miss.state is None and not miss.hit
    reply, turn1 = run(model, ids1)
    cache.put(ids1 + reply, turn1.kv, prompt_tokens=len(ids1), method="specprefill", reuse=miss, policy="exact")
    settle(cache, model)  # the dense rebuild, then the file (and the speculator's beside it)
    (entry,) = cache.entries
    assert entry.kv.position_offset == 0 and entry.speculator.slots == len(ids1) and entry.path is not None
    assert (tmp_path / "a" / (entry.path.rsplit("/", 1)[-1][: -len(".safetensors")] + SPECULATOR)).exists()
    for copy in ("b", "c"):  # a taken entry's file goes (written again when its turn is put back)
        shutil.copytree(tmp_path / "a", tmp_path / copy)
    conversation = ids1 + reply
    ids2 = conversation + tokens(model, 2, 70)

    def turn2(cache: PromptCache) -> tuple[list[int], GenerationInfo, list]:
        taken = cache.take(ids2, "exact")
        assert taken.hit and taken.cached == len(conversation) and taken.state.speculator.slots == len(ids1)
        read: list = []
        out, info = run(model, ids2, taken.state, read)
        assert [r for r in read if r[0] == "speculator"][-1][1] == len(ids2) - len(ids1)  # only its new tokens
        return out, info, read

    out, info, _ = turn2(cache)
    dense = KVState(info.kv.cache, len(conversation))  # the same prefix, no speculator KV: it reads the whole prompt
    whole_out, whole = run(model, ids2, reuse=dense)
    assert info.kept_positions == whole.kept_positions and out == whole_out
    assert min(info.kept_positions[len(conversation) :]) >= len(conversation)
    assert info.kept_tokens < len(ids2)

    restarted = PromptCache(
        None,
        model.args.max_position_embeddings,
        None,
        PromptStore(tmp_path / "b", model, "tiny", None, "self:1", "self:1"),
    )
    assert (
        len(restarted.entries) == 1 and restarted.entries[0].kv is None
    )  # disk only, the speculator file not an entry
    from_disk, info_disk, _ = turn2(restarted)
    assert info_disk.kept_positions == info.kept_positions and from_disk == out

    other = PromptCache(
        None,
        model.args.max_position_embeddings,
        None,
        PromptStore(tmp_path / "c", model, "tiny", None, "self:2", "self:2"),
    )
    taken = other.take(ids2, "exact")
    assert taken.cached == len(conversation) and taken.state.speculator is None  # another speculator's KV: not read


def test_a_shared_prefix_lends_a_copy_of_the_speculator_kv(model):
    cache = PromptCache(None, model.args.max_position_embeddings)
    ids1 = tokens(model, 3, 160)
    miss = cache.take(ids1, "exact")
    reply, turn1 = run(model, ids1)
    cache.put(ids1 + reply, turn1.kv, prompt_tokens=len(ids1), method="specprefill", reuse=miss, policy="exact")
    settle(cache, model)
    (entry,) = cache.entries
    ids2 = ids1[:40] + tokens(model, 4, 50)  # another conversation sharing 40 tokens: a copy
    taken = cache.take(ids2, "exact")
    assert taken.copied and taken.cached == 40 and taken.state.speculator.slots == 40
    assert taken.state.speculator.cache is not entry.speculator.cache
    run(model, ids2, taken.state)
    assert entry.speculator.slots == len(ids1) and entry in cache.entries  # the conversation as it was
