"""One generation at a time on the device, a bounded queue in front of it.

The model runs on one worker thread (batch 1); HTTP handlers on the event loop submit Jobs and
read their events from an asyncio queue. A full queue is refused at once (503), a cancelled job is
skipped or stopped at its next check, and whatever a generation raises becomes an error event:
the worker thread never dies on a request. A failure of the worker loop itself (a bug outside one
generation) is logged and the loop restarts; MAX_RESTARTS failures within RESTART_WINDOW_S mark the
scheduler failed: /health answers 503 with the reason, every waiting and new request gets a 503
naming it, and nothing waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specfill.core import SpecfillError

from .engine import Engine, Event, Failed, Finished
from .errors import RequestError
from .plan import Plan

log = logging.getLogger("specfill.serve")

END = None  # the last item of every job's event queue
RETRY_AFTER_MAX_S = 60  # the openai client honours Retry-After up to a minute
MAX_RESTARTS = 3  # worker loop failures within RESTART_WINDOW_S before the scheduler gives up
RESTART_WINDOW_S = 60.0


@dataclass
class Job:
    """A Plan plus the event loop and queue its handler reads events from."""

    plan: Plan
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.perf_counter)
    checked: float = field(default_factory=time.monotonic)  # when the handler last checked its client
    ended: bool = False  # a Finished or Failed event was sent

    def emit(self, event: Event | None) -> None:
        """Thread-safe: hand an event (or END) to the handler's loop (dropped if the loop closed)."""
        self.ended = self.ended or isinstance(event, (Finished, Failed))
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass

    def cancel(self) -> None:
        self.plan.cancelled.set()


class Scheduler:
    """The worker thread and its bounded queue (max_queue jobs may wait behind the running one)."""

    def __init__(self, engine: Engine, max_queue: int):
        self.engine = engine
        self.max_queue = max_queue
        self._waiting: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="specfill-worker", daemon=True)
        self._stopping = threading.Event()
        self.running: Job | None = None
        self.served = 0
        self.closed = False  # set at the first shutdown signal: new requests get 503
        self.service_seconds = 1.0  # running mean time a job holds the device (for Retry-After)
        self.restarts = 0  # times the worker loop failed and was restarted
        self._failures: list[float] = []  # when the worker loop failed (monotonic), within the window
        self._failed: str | None = None  # why the worker gave up (None while it serves)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop taking requests and cancel the running and waiting jobs (each stops at its next
        step). Safe to call from a signal handler: it only sets flags."""
        self.closed = True
        running = self.running
        if running is not None:
            running.cancel()
        for job in list(self._waiting.queue):
            if job is not None:
                job.cancel()

    def stop(self) -> None:
        """Stop after the running job is cancelled (server shutdown); joins the worker thread."""
        self.close()
        self._stopping.set()
        try:
            self._waiting.put_nowait(None)
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    @property
    def failure(self) -> str | None:
        """Why the worker no longer serves (None while it does): it gave up after repeated failures,
        or its thread ended without a shutdown."""
        if self._failed is not None:
            return self._failed
        if self._thread.ident is not None and not self._thread.is_alive() and not self._stopping.is_set():
            return "the worker thread has stopped"
        return None

    def retry_after(self) -> int:
        """Seconds until the queue has drained (the waiting jobs and the running one at the mean
        service time), 1..RETRY_AFTER_MAX_S: what a refused client should wait."""
        seconds = self.service_seconds * (self.waiting() + 1)
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(seconds)))

    def waiting(self) -> int:
        return self._waiting.qsize()

    def submit(self, job: Job) -> None:
        """Queue a job, or RequestError(503, with Retry-After) when max_queue jobs are already waiting."""
        if (failure := self.failure) is not None:
            raise RequestError(503, f"the server cannot generate: {failure}", code="worker_failed")
        if self.closed:
            raise RequestError(503, "the server is shutting down", code="shutting_down")
        try:
            self._waiting.put_nowait(job)
            if self._failed is not None:  # the worker gave up meanwhile: nobody would take the job
                self._drain()
        except queue.Full:
            raise RequestError(
                503,
                f"the server is busy: {self.max_queue} requests are already waiting for the device; retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after())},
            ) from None

    def _next_job(self) -> Job | None:
        """The next job; while none waits, the engine's idle work runs in small steps (once its delay
        has passed: a job arriving first is served first)."""
        while not self._stopping.is_set():
            delay = self.engine.idle_delay()
            if delay is None:
                return self._waiting.get()
            try:
                return self._waiting.get(timeout=delay) if delay > 0 else self._waiting.get_nowait()
            except queue.Empty:
                if delay == 0:
                    self._guarded(self.engine.idle_step)
        return None

    def _run(self) -> None:
        """The worker thread: serve jobs; a failure of the loop itself is logged and the loop
        restarts, up to MAX_RESTARTS times within RESTART_WINDOW_S (then the scheduler fails loudly)."""
        while True:
            try:
                self._serve()
                return
            except Exception as err:
                job, self.running = self.running, None
                if job is not None and not job.ended:
                    job.emit(Failed(500, f"internal error: {type(err).__name__}: {err}"))
                if job is not None:
                    job.emit(END)
                now = time.monotonic()
                self._failures = [t for t in self._failures if now - t < RESTART_WINDOW_S] + [now]
                if len(self._failures) >= MAX_RESTARTS:
                    self._give_up(
                        f"the worker failed {len(self._failures)} times in {RESTART_WINDOW_S:.0f} s, "
                        f"last with {type(err).__name__}: {err}"
                    )
                    return
                self.restarts += 1
                log.exception("the worker failed; restarting it (%d of %d)", len(self._failures), MAX_RESTARTS - 1)
            except BaseException as err:  # SystemExit and the like in this thread: no restart
                self._give_up(f"the worker thread ended with {type(err).__name__}: {err}")
                raise

    def _give_up(self, reason: str) -> None:
        """Mark the scheduler failed (health goes red) and answer every waiting job with a 503."""
        self._failed = reason
        self.closed = True
        log.exception("the server cannot generate any more: %s", reason)
        self._drain()

    def _drain(self) -> None:
        """Answer every waiting job with the failure (503)."""
        while True:
            try:
                job = self._waiting.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.emit(Failed(503, f"the server cannot generate: {self._failed}"))
                job.emit(END)

    def _serve(self) -> None:
        while True:
            job = self._next_job()
            if job is None or self._stopping.is_set():
                self._guarded(self.engine.flush)  # what waited for a quiet spell goes to disk now
                return
            if job.plan.cancelled.is_set():  # its client left (or a shutdown came) while it waited
                self._end(job)
                continue
            self.running = job
            started = time.perf_counter()
            job.plan.queue_seconds = started - job.submitted
            self._guarded(self.engine.run, job.plan, job.emit, job=job)
            self.service_seconds = 0.8 * self.service_seconds + 0.2 * (time.perf_counter() - started)
            self.served += 1  # before `running` clears: a client that sees the server idle sees it counted
            self.running = None
            self._end(job)

    def _end(self, job: Job) -> None:
        """END after a job's last event; one that a shutdown cancelled first gets a 503 saying so
        (its client, if still there, is told why no answer came)."""
        if not job.ended and self.closed:
            job.emit(Failed(503, "the server is shutting down: the generation was cancelled"))
        job.emit(END)

    def _guarded(self, work: Any, *args: Any, job: Job | None = None) -> None:
        """Run work(*args); a SpecfillError becomes a 400 event, anything else a 500 (logged)."""
        try:
            work(*args)
        except SpecfillError as err:
            if job is not None:
                job.emit(Failed(400, str(err)))
        except Exception as err:  # the worker must survive any bug in one request
            log.exception("request failed")
            if job is not None:
                job.emit(Failed(500, f"internal error: {type(err).__name__}: {err}"))
