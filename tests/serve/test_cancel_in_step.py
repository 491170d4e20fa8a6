"""A client leaving during a prefill step (issue 25 item 2): the worker stops before the next
layer, not at the end of the step, puts back the conversation it took from the prompt cache, and
the next request is served as on a fresh server. The engine in-process on the tiny torch model,
so the disconnect can land at a known layer of a known step (a forward hook sets the flag)."""

from __future__ import annotations

import pytest

from specfill.api import Session, load
from specfill.core.config import H2OConfig
from specfill.core.request import build_request
from specfill.serve.engine import Engine, Finished, Progress, Started
from specfill.serve.plan import Plan
from specfill.serve.prompt_cache import PromptCache

pytest.importorskip("torch")
STEP = 16  # prefill step size: turn 2's 40 new tokens go in 3 steps


@pytest.fixture(scope="module")
def tiny():
    import torch

    torch.set_num_threads(1)
    model, tokenizer = load("random:tiny-llama", backend="cuda", device="cpu", dtype="float32")
    model.prefill_step_size = STEP
    return model, tokenizer


def plan(ids: list[int], method: str = "full", **settings) -> Plan:
    """A streamed completion of `ids` with progress events (4 tokens; settings: build_request's)."""
    return Plan(
        kind="completion",
        ids=ids,
        request=build_request(max_tokens=4, method=method, **settings),
        method_name=method,
        stops=[],
        stream=True,
        include_usage=False,
        return_progress=True,
        prompt_cache="exact",
    )


def run(engine: Engine, job: Plan) -> list:
    events: list = []
    engine.run(job, events.append)
    return events


def conversation(engine: Engine) -> list[int]:
    """Turn 1 (50 prompt tokens) served; turn 2's ids: turn 1's conversation and 40 new tokens."""
    finished = run(engine, plan(list(range(10, 60))))[-1]
    assert isinstance(finished, Finished)
    return list(engine.cache.entries[0].tokens) + list(range(100, 140))


def test_a_disconnect_mid_step_stops_before_the_next_layer(tiny):
    model, tokenizer = tiny
    engine = Engine(Session(model, tokenizer), PromptCache(4096, model.args.max_position_embeddings))
    turn2 = conversation(engine)
    cached = len(engine.cache.entries[0].tokens)
    job, blocks, after = plan(turn2), model.model.layers, []

    def disconnect(block, inputs, output):  # the client leaves while step 2's first layer runs
        if job.cancelled.is_set():
            after.append(block)
        elif progress_events(events) == 1 and block is blocks[0]:
            job.cancelled.set()

    events: list = []
    hooks = [b.register_forward_hook(disconnect) for b in blocks]
    try:
        engine.run(job, events.append)
    finally:
        for hook in hooks:
            hook.remove()
    assert job.cancelled.is_set() and after == [], f"{len(after)} layers ran after the disconnect"
    assert progress_events(events) == 1 and not any(isinstance(e, Finished) for e in events)
    entry = engine.cache.entries[0]  # the conversation is back, for the client's retry
    assert entry.tokens == turn2[: entry.covered] and entry.covered >= cached - 1
    retried = run(engine, plan(turn2))
    fresh_engine = Engine(Session(model, tokenizer), PromptCache(4096, model.args.max_position_embeddings))
    fresh = run(fresh_engine, plan(conversation(fresh_engine)))
    assert text(retried) == text(fresh) and retried[-1].completion_tokens == fresh[-1].completion_tokens == 4
    assert retried[-1].cached_tokens == fresh[-1].cached_tokens > 0


@pytest.mark.parametrize("method", ["h2o", "specprefill"])
def test_every_method_stops_mid_step(tiny, method):
    """H2O (checked per layer and chunk) and SpecPrefill (its "self:2" speculator's layers, then the
    main model's): the client leaves during layer 1 of step 1; layer 2 never runs, nothing is
    reported after the start, no Finished, and the engine serves the same prompt afterwards."""
    model, tokenizer = tiny
    engine = Engine(Session(model, tokenizer), None)
    ids = list(range(3, 120))
    settings = (
        {"h2o": H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3)}
        if method == "h2o"
        else {"speculator": "self:2"}
    )
    job, calls = plan(ids, method, **settings), []

    def disconnect(block, inputs, output):
        calls.append(block)
        job.cancelled.set()

    hooks = [block.register_forward_hook(disconnect) for block in model.model.layers]
    try:
        events = run(engine, job)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [model.model.layers[0]] and events == [Started(cached=0)]
    assert isinstance(run(engine, plan(ids, method, **settings))[-1], Finished)


def progress_events(events: list) -> int:
    return sum(isinstance(e, Progress) for e in events)


def text(events: list) -> str:
    return "".join(e.text for e in events if type(e).__name__ == "Delta")
