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
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Delta, Engine, Failed, Finished, Progress
from .errors import RequestError, error_body
from .plan import ServerDefaults, build_plan, chat_prompt_ids, completion_prompt_ids
from .protocol import ChatRequest, CompletionRequest, parse_body
from .responses import ResponseShape, sse
from .scheduler import END, Job, Scheduler

log = logging.getLogger("specfill.serve")
POLL_SECONDS = 0.2  # how often a waiting handler checks that its client is still there


class ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


def create_app(engine: Engine, defaults: ServerDefaults, *, max_queue: int = 8) -> FastAPI:
    """The ASGI app serving `engine` (start it with uvicorn; the worker thread lives with the app)."""
    scheduler = Scheduler(engine, max_queue)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="specfill", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    started = int(time.time())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(err.status_code, str(err.detail)), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body(500, f"internal error: {type(err).__name__}: {err}"), status_code=500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": defaults.model_id, "busy": scheduler.running is not None,
                "waiting": scheduler.waiting(), "served": scheduler.served, **engine.health()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": defaults.model_id, "object": "model", "created": started,
                                            "owned_by": "specfill"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await _answer("chat", request, engine, defaults, scheduler)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _answer("completion", request, engine, defaults, scheduler)

    return app


async def _answer(kind: str, request: Request, engine: Engine, defaults: ServerDefaults,
                  scheduler: Scheduler) -> Any:
    try:
        raw = await request.body()
        if kind == "chat":
            body = parse_body(raw, ChatRequest)
            ids = chat_prompt_ids(engine.tokenizer, body)
        else:
            body = parse_body(raw, CompletionRequest)
            ids = completion_prompt_ids(engine.tokenizer, body, engine.model.args.vocab_size)
        plan = build_plan(kind, body, ids, defaults, engine.context)
        job = Job(plan, asyncio.get_running_loop())
        scheduler.submit(job)
    except RequestError as err:
        return JSONResponse(err.body(), status_code=err.status)
    shape = ResponseShape(plan, defaults.model_id)
    if plan.stream:
        return StreamingResponse(_stream(job, shape, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return await _whole(job, shape, request)
    except (ClientGone, asyncio.CancelledError):
        job.cancel()
        raise


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


async def _whole(job: Job, shape: ResponseShape, request: Request) -> JSONResponse:
    pieces: list[str] = []
    while (event := await _next_event(job, request)) is not END:
        if isinstance(event, Delta):
            pieces.append(event.text)
        elif isinstance(event, Failed):
            return JSONResponse(error_body(event.status, event.message), status_code=event.status)
        elif isinstance(event, Finished):
            return JSONResponse(shape.whole("".join(pieces), event))
    return JSONResponse(error_body(500, "the generation ended without a result"), status_code=500)


async def _stream(job: Job, shape: ResponseShape, request: Request) -> AsyncIterator[str]:
    """Server-sent events: role chunk, progress / text chunks, final chunk(s), [DONE]. Errors after
    the stream began arrive as an `error` event (the openai client raises them)."""
    try:
        opening = shape.opening()
        if opening is not None:
            yield sse(opening)
        while (event := await _next_event(job, request)) is not END:
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
