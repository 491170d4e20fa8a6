"""The FastAPI application: routes, streaming, error bodies, disconnect handling.

Every request is parsed and planned on the event loop (400s return at once), queued for the
worker thread (503 when the queue is full), then answered as one JSON body or as server-sent
events. A client that goes away cancels its generation: the handler notices (the stream is
cancelled, or a poll of the connection sees the disconnect) and flags the job, which the worker
checks between prefill steps and between tokens.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .access import Access, protect
from .engine import Delta, Engine, Failed, Finished, Progress
from .errors import RequestError, error_body
from .info import add_info_routes, check_model
from .metrics import Metrics, Outcome
from .plan import ServerDefaults, build_plan, chat_prompt_ids, completion_prompt_ids
from .protocol import ChatRequest, CompletionRequest, parse_body
from .responses import ResponseShape, sse
from .scheduler import END, Job, Scheduler

log = logging.getLogger("specfill.serve")
POLL_SECONDS = 0.2  # how often a waiting handler checks that its client is still there


class ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


def create_app(engine: Engine, defaults: ServerDefaults, *, max_queue: int = 8, access: Access = Access()) -> FastAPI:
    """The ASGI app serving `engine` (start it with uvicorn; the worker thread lives with the app)."""
    scheduler = Scheduler(engine, max_queue)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="specfill", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(err.status_code, str(err.detail)), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body(500, f"internal error: {type(err).__name__}: {err}"), status_code=500)

    add_info_routes(app, engine, defaults, scheduler, metrics)
    context = _Context(engine, defaults, scheduler, metrics)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await _answer("chat", request, context)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _answer("completion", request, context)

    protect(app, access)
    return app


class _Context:
    """What every generation handler needs (one per app)."""

    def __init__(self, engine: Engine, defaults: ServerDefaults, scheduler: Scheduler, metrics: Metrics):
        self.engine, self.defaults, self.scheduler, self.metrics = engine, defaults, scheduler, metrics


async def _answer(kind: str, request: Request, ctx: _Context) -> Any:
    engine, defaults = ctx.engine, ctx.defaults
    try:
        raw = await request.body()
        if kind == "chat":
            body = parse_body(raw, ChatRequest)
            check_model(body.model, defaults)
            ids = chat_prompt_ids(engine.tokenizer, body)
        else:
            body = parse_body(raw, CompletionRequest)
            check_model(body.model, defaults)
            ids = completion_prompt_ids(engine.tokenizer, body, engine.model.args.vocab_size)
        plan = build_plan(kind, body, ids, defaults, engine.context)
        job = Job(plan, asyncio.get_running_loop())
        ctx.scheduler.submit(job)
    except RequestError as err:
        named = err.param is None or err.param in err.message
        ctx.metrics.record(Outcome("req-" + uuid.uuid4().hex[:12], kind, str(err.status),
                                   err.message if named else f"{err.param}: {err.message}"))
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
    shape = ResponseShape(plan, defaults.model_id)
    outcome = Outcome(shape.id, kind, "cancelled")
    if plan.stream:
        return StreamingResponse(_stream(job, shape, request, outcome, ctx.metrics), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return await _whole(job, shape, request, outcome)
    except (ClientGone, asyncio.CancelledError):
        job.cancel()
        raise
    finally:
        ctx.metrics.record(outcome)


def _settle(outcome: Outcome, event: Any) -> None:
    """Fill `outcome` from a job's last event (Finished: ok; Failed: its status)."""
    if isinstance(event, Finished):
        outcome.outcome, outcome.stats = "ok", event.stats
    elif isinstance(event, Failed):
        outcome.outcome, outcome.reason = str(event.status), event.message


async def _next_event(job: Job, request: Request) -> Any:
    """The job's next event; checks the connection every POLL_SECONDS (while waiting, and between
    events: a busy stream never times out) and cancels the job once the client is gone."""
    while True:
        if time.monotonic() - job.checked >= POLL_SECONDS:
            job.checked = time.monotonic()
            if await request.is_disconnected():
                job.cancel()
                raise ClientGone
        try:
            return await asyncio.wait_for(job.events.get(), timeout=POLL_SECONDS)
        except asyncio.TimeoutError:
            continue


async def _whole(job: Job, shape: ResponseShape, request: Request, outcome: Outcome) -> JSONResponse:
    pieces: list[str] = []
    while (event := await _next_event(job, request)) is not END:
        _settle(outcome, event)
        if isinstance(event, Delta):
            pieces.append(event.text)
        elif isinstance(event, Failed):
            return JSONResponse(error_body(event.status, event.message), status_code=event.status)
        elif isinstance(event, Finished):
            return JSONResponse(shape.whole("".join(pieces), event))
    return JSONResponse(error_body(500, "the generation ended without a result"), status_code=500)


async def _stream(job: Job, shape: ResponseShape, request: Request, outcome: Outcome,
                  metrics: Metrics) -> AsyncIterator[str]:
    """Server-sent events: role chunk, progress / text chunks, final chunk(s), [DONE]. Errors after
    the stream began arrive as an `error` event (the openai client raises them)."""
    try:
        opening = shape.opening()
        if opening is not None:
            yield sse(opening)
        while (event := await _next_event(job, request)) is not END:
            _settle(outcome, event)
            if isinstance(event, Progress):
                yield sse(shape.progress(event))
            elif isinstance(event, Delta):
                yield sse(shape.delta(event.text))
            elif isinstance(event, Finished):
                for chunk in shape.closing(event):
                    yield sse(chunk)
            elif isinstance(event, Failed):
                yield sse(error_body(event.status, event.message))
        yield sse("[DONE]")
    except ClientGone:
        return
    finally:
        job.cancel()  # a no-op once the job ended; stops it if the client went away
        metrics.record(outcome)
