"""Sparse turns over the prompt cache through the server's Engine (tiny random model, float32, both
backends): `auto` and the composition (SpecPrefill over an H2O speculator) reuse a cached prefix
however short (no whole-prompt run instead), auto deciding on the new part's length; under the exact
policy the sparse new part is rebuilt densely in idle time, or by the next sparse turn itself before
it runs, and the turn after reuses the whole conversation with a dense run's reply."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.api import Session
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.request import build_request
from specfill.core.runtime import COMPOSED, GenerationInfo, KVState, PrefillMethod, SamplingConfig
from specfill.serve.engine import Delta, Engine, Finished
from specfill.serve.plan import Plan
from specfill.serve.prompt_cache import PromptCache
from tests.fixtures.tiny_models import load_tiny

NAME = "random:tiny-llama"
H2O = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=0)
SPEC = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3, speculator_prefill=H2O)


@pytest.fixture(scope="module", params=["cuda", "mlx"])
def engine_parts(request):
    return load_tiny(request.param, NAME)


@pytest.fixture
def engine(engine_parts):
    model, tokenizer = engine_parts
    return Engine(Session(model, tokenizer), PromptCache(None, model.args.max_position_embeddings, 10**9))


def tokens(model, seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(4, model.args.vocab_size, n).tolist()


def ask(engine: Engine, ids: list[int], method: str = "full", policy: str = "exact", **settings) -> Finished:
    """One greedy request (6 tokens) through the Engine: its Finished event (its text in stats["text"])."""
    built = build_request(max_tokens=6, method=method, **settings)
    job = Plan("completion", ids, built, method, [], False, False, False, policy)
    events: list = []
    engine.run(job, events.append)
    assert isinstance(events[-1], Finished), events[-1]
    events[-1].stats["text"] = "".join(e.text for e in events if isinstance(e, Delta))
    return events[-1]


def composed(engine: Engine, ids: list[int]) -> Finished:
    return ask(engine, ids, "specprefill", specprefill=SPEC, speculator="self:1")


def settle(engine: Engine) -> None:
    while engine.has_idle_work():
        engine.idle_step()


def assert_dense_next_turn(engine: Engine, prompt: list[int], seed: int) -> None:
    """The next full turn of the conversation `prompt` began reuses all of it (rebuilt densely), with
    the reply of a run without the cache."""
    (entry,) = [e for e in engine.cache.entries if e.tokens[: len(prompt)] == prompt]
    assert entry.exact and not entry.rebuilding and entry.kv.position_offset == 0
    ids = entry.tokens + tokens(engine.model, seed, 8)
    done = ask(engine, ids)
    assert done.cached_tokens == len(entry.tokens)
    assert done.stats["text"] == ask(engine, ids, policy="off").stats["text"]


def test_auto_reuses_a_short_prefix_and_decides_on_the_new_part(engine):
    """A 64-token system prompt before a 100-token new part: reused (the old rule ran the method over the
    whole prompt); threshold 150: the whole prompt (164) would go sparse, the new part (100) stays full;
    threshold 90: H2O walked from the prefix, rebuilt densely in idle time; the next turn is exact."""
    model = engine.model
    system = tokens(model, 1, 64)
    ask(engine, system + tokens(model, 2, 20))
    below = ask(engine, system + tokens(model, 3, 100), "auto", h2o=H2O, auto_threshold=150)
    assert below.cached_tokens == 64 and below.stats["prefill_method"] == "full"
    ids = system + tokens(model, 4, 100)
    above = ask(engine, ids, "auto", h2o=H2O, auto_threshold=90)
    assert above.cached_tokens == 64 and above.stats["prefill_method"] == "h2o"
    pending = [e for e in engine.cache.entries if e.rebuilding]
    assert len(pending) == 1 and pending[0].covered == 64  # from the reused dense prefix on
    settle(engine)
    assert_dense_next_turn(engine, ids, 5)


def test_the_composition_reuses_a_short_prefix_and_is_rebuilt_densely(engine):
    model = engine.model
    system = tokens(model, 11, 64)
    ask(engine, system + tokens(model, 12, 20))
    ids = system + tokens(model, 13, 120)
    done = composed(engine, ids)
    assert done.cached_tokens == 64 and done.stats["prefill_method"] == COMPOSED
    assert 64 < done.stats["kept_tokens"] < 64 + 120  # the prefix, then the kept new tokens
    (pending,) = [e for e in engine.cache.entries if e.rebuilding]
    assert pending.covered == 64 and pending.speculator is None  # the H2O speculator's KV is not kept
    settle(engine)
    assert_dense_next_turn(engine, ids, 14)


def test_a_sparse_turn_before_the_rebuild_finished_completes_it_first(engine):
    """Turn 2 (the composition) leaves its new part to rebuild; turn 3 (auto -> H2O) arrives before any
    idle step: it rebuilds turn 2's conversation densely itself, reuses all of it and answers as H2O
    from a cold dense prefill of it does; the turn after is exact."""
    model = engine.model
    first = tokens(model, 21, 70)
    ask(engine, first)
    (entry,) = engine.cache.entries
    turn2 = entry.tokens + tokens(model, 22, 90)
    assert "rebuild" not in composed(engine, turn2).stats["prefill_seconds"]  # nothing was left to rebuild
    (entry,) = engine.cache.entries
    assert entry.rebuilding and entry.covered == len(first) + 5  # turn 1's conversation (its last token unfed)
    conversation = entry.tokens
    turn3 = conversation + tokens(model, 23, 60)
    done = ask(engine, turn3, "auto", h2o=H2O, auto_threshold=40)
    assert done.cached_tokens == len(conversation) and done.stats["prefill_method"] == "h2o"
    # the rebuild it waited for is part of its TTFT (the client waited for it), and named apart
    rebuild = done.stats["prefill_seconds"]["rebuild"]
    assert 0 < rebuild < done.stats["ttft_s"]
    cold = GenerationInfo()
    list(model.generate_step(conversation + [1], max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(),
                             method=PrefillMethod(), info=cold))  # fmt: skip
    want = list(
        model.generate_step(
            turn3,
            max_tokens=6,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod("h2o", h2o=H2O),
            info=GenerationInfo(),
            reuse=KVState(cold.kv.cache, len(conversation)),
        )
    )
    assert done.stats["text"] == engine.tokenizer.decode(want)
    settle(engine)
    assert_dense_next_turn(engine, turn3, 24)
