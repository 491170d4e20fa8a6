"""The speculator's KV of a kept conversation built up densely (serve/speculator_kv.py): after a
composition turn (whose H2O speculator leaves no dense KV of its new part) the exact policy's idle
rebuild brings the speculator KV to the conversation's end, reply included, equal to a cold dense
speculator pass; the next SpecPrefill turn's speculator then prefills only its new tokens and keeps
what a cold dense speculator over the whole prompt keeps. A SpecPrefill request arriving before the
idle work has it done first (PromptCache.finish). Tiny random model, float32."""

from __future__ import annotations

import numpy as np
import pytest

from specfill import load
from specfill.api import Session
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.methods.specprefill import run_speculator
from specfill.core.request import build_request
from specfill.core.runtime import KVState, PrefillMethod
from specfill.serve.engine import Engine, Finished
from specfill.serve.plan import Plan
from specfill.serve.prompt_cache import PromptCache
from tests.fixtures.tiny_models import greedy_run, load_tiny, random_tokens

H2O = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=0)
PLAIN = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3)
COMPOSED = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3, speculator_prefill=H2O)


@pytest.fixture(scope="module", params=["cuda", "mlx"])
def model(request):
    return load_tiny(request.param)[0]


tokens = random_tokens


def run(model, ids, method: PrefillMethod, reuse=None):
    """(the reply, the info, the speculator's prefilled tokens: its progress stage's total)."""
    read: list = []
    out, info = greedy_run(model, ids, method, reuse, read=read)
    return out, info, max((total for stage, total in read if stage == "speculator"), default=0)


def specprefill(config: SpecPrefillConfig) -> PrefillMethod:
    return PrefillMethod("specprefill", specprefill=config, speculator="self:1")


def turn(cache: PromptCache, model, ids, method: PrefillMethod, name: str):
    taken = cache.take(ids, "exact")
    out, info, read = run(model, ids, method, taken.state)
    cache.put(ids + out, info.kv, prompt_tokens=len(ids), method=name, reuse=taken, policy="exact")
    return taken, out, info, read


def settle(cache: PromptCache, model) -> None:
    while cache.has_idle_work():
        cache.idle_step(model)


def assert_dense_speculator_kv(model, kv: KVState, ids: list[int]) -> None:
    """kv (a speculator KV) holds the keys of a cold dense speculator pass over ids (fp32 rounding)."""
    spec, step = model.speculator_model("self:1")
    with model.ops.device_scope():
        cold = run_speculator(model.ops, spec, np.array(ids), lookahead=0, stop_ids=frozenset(), step_size=step)
        want = model.ops.to_numpy(cold.keys)
        got = model.ops.to_numpy(kv.cache.keys(kv.slots))
    assert kv.slots == len(ids) and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_rebuild_brings_the_speculator_kv_to_the_conversation_end(model):
    cache = PromptCache(None, model.args.max_position_embeddings)
    cache.use_speculator(model, "self:1")
    system = tokens(model, 1, 64)
    turn(cache, model, system, PrefillMethod(), "full")
    assert not cache.has_idle_work()  # a conversation that never ran SpecPrefill: no speculator KV built
    (entry,) = cache.entries
    ids2 = entry.tokens + tokens(model, 2, 120)
    taken, *_ = turn(cache, model, ids2, specprefill(COMPOSED), "specprefill")
    (entry,) = cache.entries
    assert entry.rebuilding and entry.speculator is None  # its H2O speculator left no dense KV of the new part
    settle(cache, model)
    (entry,) = cache.entries
    conversation2 = entry.tokens
    assert not entry.rebuilding and entry.kv.tokens == len(conversation2)
    assert_dense_speculator_kv(model, entry.speculator, conversation2)  # the reply's tokens too
    assert cache.stats()["speculator_tokens"] == len(conversation2)

    ids3 = conversation2 + tokens(model, 3, 70)  # a plain SpecPrefill turn
    taken, out, info, read = turn(cache, model, ids3, specprefill(PLAIN), "specprefill")
    assert taken.cached == len(conversation2) and taken.state.speculator.slots == len(conversation2)
    assert read == 70  # the speculator prefilled only the new tokens
    cold_out, cold, cold_read = run(model, ids3, specprefill(PLAIN), KVState(info.kv.cache, len(conversation2)))
    assert cold_read == len(ids3)  # no speculator KV: a cold dense speculator over the whole prompt
    assert info.kept_positions == cold.kept_positions and out == cold_out
    settle(cache, model)
    (entry,) = cache.entries
    assert_dense_speculator_kv(model, entry.speculator, entry.tokens)  # prompt and reply

    ids4 = entry.tokens + tokens(model, 4, 30)  # a full turn: its speculator KV is built up after it too
    turn(cache, model, ids4, PrefillMethod(), "full")
    settle(cache, model)
    (entry,) = cache.entries
    assert_dense_speculator_kv(model, entry.speculator, entry.tokens[: entry.kv.tokens])

    edited = entry.tokens[:-3] + tokens(model, 5, 20)  # its own turn, cut 3 tokens short: its slots past the match
    taken = cache.take(edited, "exact")  # are another conversation's, not lent
    assert not taken.copied and taken.state.speculator.slots == taken.cached == len(entry.tokens) - 3


def test_a_specprefill_turn_before_the_idle_work_builds_the_speculator_kv_first(model):
    tokenizer = load("random:tiny-llama", backend=model.backend, device="cpu", dtype="float32")[1]
    cache = PromptCache(None, model.args.max_position_embeddings, 10**9)
    cache.use_speculator(model, "self:1")
    engine = Engine(Session(model, tokenizer), cache)

    def ask(ids: list[int]) -> Finished:
        built = build_request(max_tokens=4, method="specprefill", specprefill=COMPOSED, speculator="self:1")
        events: list = []
        engine.run(Plan("completion", ids, built, "specprefill", [], False, False, False, "exact"), events.append)
        assert isinstance(events[-1], Finished), events[-1]
        return events[-1]

    ask(tokens(model, 11, 80))
    (entry,) = cache.entries
    conversation = entry.tokens
    assert entry.rebuilding and entry.speculator is None and engine.has_idle_work()
    done = ask(conversation + tokens(model, 12, 60))  # before any idle step
    assert done.cached_tokens == len(conversation)
    assert cache.stats()["speculator_tokens"] == len(conversation)  # built densely first, by finish
    (entry,) = cache.entries
    assert entry.speculator.slots == len(conversation)  # the dense speculator KV it started from, kept
    while engine.has_idle_work():
        engine.idle_step()
    (entry,) = cache.entries
    assert_dense_speculator_kv(model, entry.speculator, entry.tokens)
