"""A streamed answer that has nothing to say for KEEPALIVE_SECONDS (a long prefill, a wait in the
queue) sends its shape's keep-alive: Claude Code's HTTP client dropped a stream after 300 s without a
byte during a 18K-token prefill, and retried it from the start. In-process: app._stream over a job
whose events a test hands in, each route's real shape, the official clients' event types."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from specfill.serve import app
from specfill.serve.anthropic_shape import MessageShape
from specfill.serve.chat import ChatSetup
from specfill.serve.engine import Delta, Finished, Started
from specfill.serve.metrics import Outcome
from specfill.serve.openai_responses import ResponsesRequest
from specfill.serve.openai_responses_shape import ResponsesShape
from specfill.serve.responses import ResponseShape
from specfill.serve.scheduler import END, Job

PLAN = SimpleNamespace(
    stream=True, created=1.0, kind="chat", ids=[1, 2, 3], include_usage=False, cancelled=asyncio.Event()
)


class Connected:
    async def is_disconnected(self) -> bool:
        return False


def shapes() -> dict:
    return {
        "chat": ResponseShape(PLAN, "m", ChatSetup()),
        "messages": MessageShape(PLAN, "m", ChatSetup()),
        "responses": ResponsesShape(PLAN, "m", ChatSetup(), ResponsesRequest.model_validate({"input": "Hi"}), []),
    }


def play(shape, timeline: list[tuple[float, object]]) -> list[str]:
    """The chunks `_stream` yields while the events arrive after the given pauses (seconds)."""

    async def run() -> list[str]:
        job = Job(PLAN, asyncio.get_running_loop())

        async def feed() -> None:
            for pause, event in timeline:
                await asyncio.sleep(pause)
                job.events.put_nowait(event)

        feeding = asyncio.ensure_future(feed())
        chunks = [c async for c in app._stream(job, shape, Connected(), Outcome("x", "chat", "cancelled"), METRICS)]
        await feeding
        return chunks

    return asyncio.run(run())


class _Metrics:
    def record(self, outcome) -> None:
        pass


METRICS = _Metrics()
DONE = Finished(
    stats={},
    prompt_tokens=3,
    cached_tokens=0,
    completion_tokens=1,
    finish_reason="stop",
)


def keepalives(chunks: list[str]) -> int:
    return sum(
        c == ": keep-alive\n\n"
        or c.startswith("event: ping")
        or '"response.in_progress"' in c
        and "sequence_number" in c
        for c in chunks
    )


@pytest.mark.parametrize("route", ["chat", "messages", "responses"])
def test_a_silent_stream_sends_keepalives(route, monkeypatch):
    monkeypatch.setattr(app, "KEEPALIVE_SECONDS", 0.3)
    shape = shapes()[route]
    quiet = play(shape, [(0.0, Started(0)), (1.1, Delta("Hi")), (0.0, DONE), (0.0, END)])
    chatty = play(shapes()[route], [(0.0, Started(0))] + [(0.1, Delta("a"))] * 10 + [(0.0, DONE), (0.0, END)])
    opening = {"chat": 0, "messages": 1, "responses": 1}[route]  # message_start's ping; the opening in_progress
    assert keepalives(quiet) - opening >= 2  # ~3 pauses of 0.3 s in 1.1 s
    assert keepalives(chatty) == opening  # a token every 0.1 s: nothing added
    if route != "chat":  # each keep-alive is an event the official client parses
        events = [c.split("data: ", 1)[1] for c in quiet if c.startswith("event:")]
        assert all(json.loads(e)["type"] for e in events)
    if route == "responses":
        from openai.types.responses import ResponseStreamEvent
        from pydantic import TypeAdapter

        parsed = [TypeAdapter(ResponseStreamEvent).validate_python(json.loads(e)) for e in events]
        assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
