"""The worker thread behind the HTTP handlers (specfill/serve/scheduler.py), driven with a stand-in
engine: a job whose client left while it waited is skipped and the worker serves on; a failure of the
worker loop itself restarts it; repeated failures turn /health red (503 with the reason) and answer
every waiting and new request with a 503, so no request waits forever."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from specfill.serve.engine import Failed, Finished
from specfill.serve.errors import RequestError
from specfill.serve.scheduler import END, MAX_RESTARTS, Job, Scheduler

WAIT_S = 10.0  # far longer than any step below takes; a hung worker fails the test instead of the run


class StandIn:
    """An engine whose run() holds the device until `release` is set (so jobs queue behind it)."""

    context = 4096
    tokenizer = SimpleNamespace(chat_template=None)  # no tool format: the app's start-up reads it

    def __init__(self, idle_failures: int = 0) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.idle_failures = idle_failures  # idle_delay raises this many times (a bug outside a request)
        self.ran: list[Any] = []

    def idle_delay(self) -> float | None:
        if self.idle_failures:
            self.idle_failures -= 1
            raise RuntimeError("a bug in the idle work")
        return None

    def idle_step(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def health(self) -> dict[str, Any]:
        return {}

    def run(self, plan: Any, emit: Any) -> None:
        self.ran.append(plan)
        self.entered.set()
        self.release.wait(WAIT_S)
        if not plan.cancelled.is_set():  # cancelled: the engine returns with no event
            emit(Finished("length", 1, 1, 0, {}))


def plan() -> Any:
    return SimpleNamespace(cancelled=threading.Event(), queue_seconds=0.0)


async def events(job: Job) -> list[Any]:
    """Every event of `job` up to END (a TimeoutError if END does not come)."""
    out = []
    while (event := await asyncio.wait_for(job.events.get(), WAIT_S)) is not END:
        out.append(event)
    return out


async def until(flag: threading.Event) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, flag.wait, WAIT_S)


def test_job_cancelled_while_queued_is_skipped_and_the_worker_serves_on():
    """The client of a waiting job hangs up; once the device is free the job ends with no event
    (nothing ran) and the next request is answered (the worker thread used to die here)."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        engine = StandIn()
        scheduler = Scheduler(engine, max_queue=3)  # type: ignore[arg-type]
        scheduler.start()
        try:
            running, gone, later = (Job(plan(), loop) for _ in range(3))
            scheduler.submit(running)
            await until(engine.entered)
            scheduler.submit(gone)
            gone.cancel()  # what the handler does when it sees the disconnect
            engine.release.set()
            assert [type(e) for e in await events(running)] == [Finished]
            assert await events(gone) == []
            scheduler.submit(later)
            assert [type(e) for e in await events(later)] == [Finished]
            assert engine.ran == [running.plan, later.plan]
            assert scheduler.failure is None and scheduler.restarts == 0 and scheduler.served == 2
        finally:
            engine.release.set()
            scheduler.stop()

    asyncio.run(scenario())


def test_shutdown_answers_the_running_and_waiting_jobs_with_503():
    """close() (the first signal) cancels the running and the waiting job: each gets a 503 saying
    the server is shutting down, not an answerless end (a handler turned that into a 500)."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        engine = StandIn()
        scheduler = Scheduler(engine, max_queue=3)  # type: ignore[arg-type]
        scheduler.start()
        try:
            running, waiting = Job(plan(), loop), Job(plan(), loop)
            scheduler.submit(running)
            await until(engine.entered)
            scheduler.submit(waiting)
            scheduler.close()
            engine.release.set()
            for job in (running, waiting):
                (failed,) = await events(job)
                assert isinstance(failed, Failed) and failed.status == 503 and "shutting down" in failed.message
            assert engine.ran == [running.plan]
        finally:
            engine.release.set()
            scheduler.stop()

    asyncio.run(scenario())


def test_worker_loop_failure_restarts_it(caplog):
    """A bug outside one request (here in the idle work) is logged with its traceback, the loop
    restarts and requests are answered."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        engine = StandIn(idle_failures=1)
        engine.release.set()
        scheduler = Scheduler(engine, max_queue=3)  # type: ignore[arg-type]
        scheduler.start()
        try:
            job = Job(plan(), loop)
            scheduler.submit(job)
            assert [type(e) for e in await events(job)] == [Finished]
            assert scheduler.restarts == 1 and scheduler.failure is None
        finally:
            scheduler.stop()

    with caplog.at_level(logging.ERROR, logger="specfill.serve"):
        asyncio.run(scenario())
    assert any("restarting" in r.getMessage() and r.exc_info for r in caplog.records)


def test_worker_that_keeps_failing_turns_health_red_and_refuses_with_the_reason(caplog):
    """MAX_RESTARTS failures in a row: the job that waited gets a 503 naming the failure (no hang),
    a new request is refused at once with it, and /health answers 503 with status "failed"."""
    pytest.importorskip("fastapi")
    from specfill.serve.app import create_app
    from specfill.serve.plan import ServerDefaults

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        engine = StandIn()
        app = create_app(engine, ServerDefaults(model_id="stand-in"), max_queue=3)  # type: ignore[arg-type]
        scheduler: Scheduler = app.state.scheduler
        scheduler.start()
        try:
            running, waiting = Job(plan(), loop), Job(plan(), loop)
            scheduler.submit(running)
            await until(engine.entered)
            scheduler.submit(waiting)
            engine.idle_failures = MAX_RESTARTS  # every turn of the loop fails from now on
            engine.release.set()
            assert [type(e) for e in await events(running)] == [Finished]
            (failed,) = await events(waiting)
            assert isinstance(failed, Failed) and failed.status == 503
            assert "the worker failed 3 times" in failed.message and "a bug in the idle work" in failed.message
            with pytest.raises(RequestError) as refused:
                scheduler.submit(Job(plan(), loop))
            assert refused.value.status == 503 and "a bug in the idle work" in refused.value.message
            (health,) = [r for r in app.routes if getattr(r, "path", None) == "/health"]
            reply = await health.endpoint()  # type: ignore[attr-defined]
            body = json.loads(reply.body)
            assert reply.status_code == 503 and body["status"] == "failed"
            assert "a bug in the idle work" in body["reason"]
        finally:
            scheduler.stop()

    with caplog.at_level(logging.ERROR, logger="specfill.serve"):
        asyncio.run(scenario())
    assert any("cannot generate any more" in r.getMessage() for r in caplog.records)


class Writer(StandIn):
    """An engine with one disk write to do, which may start `quiet` s after its first ask (as
    PromptCache.idle_delay says after a put); idle_step records when it ran."""

    def __init__(self, quiet: float) -> None:
        super().__init__()
        self.release.set()  # jobs run at once
        self.due = time.monotonic() + quiet
        self.written: list[float] = []

    def idle_delay(self) -> float | None:
        return None if self.written else max(0.0, self.due - time.monotonic())

    def idle_step(self) -> None:
        self.written.append(time.monotonic())

    def flush(self) -> None:
        if not self.written:
            self.idle_step()


def test_a_job_arriving_in_the_quiet_spell_runs_before_the_disk_write():
    """The write waits for its delay; a job submitted meanwhile is served first (an agent's next turn
    used to wait for the previous turn's whole file), and the write still happens after it."""

    async def scenario() -> None:
        engine = Writer(quiet=0.5)
        scheduler = Scheduler(engine, max_queue=3)  # type: ignore[arg-type]
        scheduler.start()
        try:
            await asyncio.sleep(0.1)
            job = Job(plan(), asyncio.get_running_loop())
            scheduler.submit(job)
            assert [type(e) for e in await events(job)] == [Finished]
            assert engine.written == []  # served inside the quiet spell, nothing written before it
            await asyncio.sleep(0.8)
            assert len(engine.written) == 1 and engine.written[0] >= engine.due
        finally:
            scheduler.stop()

    asyncio.run(scenario())
