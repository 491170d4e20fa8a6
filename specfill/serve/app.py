"""The FastAPI application: routes, streaming, error bodies, disconnect handling.

Routes: /v1/chat/completions and /v1/completions (OpenAI), /v1/responses (OpenAI's Responses API,
translated into the chat Plan by openai_responses.py), /v1/messages and its count_tokens
(Anthropic, translated into the same chat Plan by anthropic.py); each is a Route: its parse, its
response shape, its error bodies.

Every request is parsed and planned on the event loop (400s return at once), queued for the
worker thread (503 when the queue is full), then answered as one JSON body or as server-sent
events. A client that goes away cancels its generation: the handler notices (the stream is
cancelled, or a poll of the connection sees the disconnect) and flags the job, which the worker
checks between prefill steps and between tokens.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .access import Access, protect
from .anthropic import prepare as prepare_messages
from .anthropic_shape import MessageShape
from .chat import chat_prompt, chat_setup
from .engine import Delta, Engine, Failed, Finished
from .errors import RequestError, anthropic_error_body, error_body, is_anthropic_path
from .info import add_info_routes, check_model
from .metrics import Metrics, Outcome
from .openai_responses import prepare as prepare_responses
from .openai_responses_shape import ResponsesShape
from .plan import SPECPREFILL_METHODS, Plan, ServerDefaults, build_plan, completion_prompt_ids, method_name
from .protocol import ChatRequest, CompletionRequest, parse_body
from .responses import ResponseShape
from .scheduler import END, Job, Scheduler
from .segments import protected_spans
from .tool_parsers import detect_format

log = logging.getLogger("specfill.serve")
POLL_SECONDS = 0.2  # how often a waiting handler checks that its client is still there
KEEPALIVE_SECONDS = 15.0  # a stream silent this long sends its shape's keep-alive: clients drop a silent
# stream (Node's fetch, so Claude Code, after 300 s without a byte; Codex after 300 s without an event)
# and a long prefill, or a wait in the queue, says nothing for minutes
QUIET = object()  # _next_event's answer when its deadline passes first


class ClientGone(Exception):
    """The client disconnected while its request waited or ran."""


def create_app(engine: Engine, defaults: ServerDefaults, *, max_queue: int = 8, access: Access = Access()) -> FastAPI:
    """The ASGI app serving `engine` (start it with uvicorn; the worker thread lives with the app)."""
    scheduler = Scheduler(engine, max_queue)
    metrics = Metrics()
    tool_format = detect_format(engine.tokenizer.chat_template)
    if tool_format is not None and (why := tool_format.missing()) is not None:
        log.warning("tool calls: the model writes the %s format, read with mlx-lm: %s", tool_format.name, why)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="specfill", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        body = _error_for(request.url.path)(err.status_code, str(err.detail))
        return JSONResponse(body, status_code=err.status_code)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, err: ClientDisconnect) -> Response:
        """The client hung up before its body arrived (or a shutdown hung up on it): nothing to
        answer, nothing to log (nginx's 499 for the record)."""
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        body = _error_for(request.url.path)(500, f"internal error: {type(err).__name__}: {err}")
        return JSONResponse(body, status_code=500)

    add_info_routes(app, engine, defaults, scheduler, metrics)
    context = _Context(engine, defaults, scheduler, metrics)

    for path, route in GENERATION_ROUTES.items():
        app.add_api_route(path, _endpoint(route, context), methods=["POST"], name=route.kind)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        try:
            _, _, ids, _ = prepare_messages(await request.body(), engine.tokenizer, defaults, counting=True)
        except RequestError as err:
            return JSONResponse(anthropic_error_body(err.status, err.message), status_code=err.status)
        return {"input_tokens": len(ids)}

    protect(app, access)
    return app


class _Context:
    """What every generation handler needs (one per app)."""

    def __init__(self, engine: Engine, defaults: ServerDefaults, scheduler: Scheduler, metrics: Metrics):
        self.engine, self.defaults, self.scheduler, self.metrics = engine, defaults, scheduler, metrics


@dataclass(frozen=True)
class Route:
    """One generation route: its name in the log, how a body becomes a Plan and the shape of its
    response (RequestError for a bad one), and its error bodies (OpenAI's or Anthropic's)."""

    kind: str  # "chat", "completion", "responses", "messages"
    prepare: Callable[[bytes, _Context], tuple[Plan, Any]]
    error: Callable[..., dict[str, Any]]  # (status, message, param, code) -> body


def _prepare_chat(raw: bytes, ctx: _Context) -> tuple[Plan, Any]:
    body = parse_body(raw, ChatRequest)
    check_model(body.model, ctx.defaults)
    setup = chat_setup(body, ctx.engine.tokenizer.chat_template, ctx.defaults.chat_template_kwargs)
    ids, setup = chat_prompt(ctx.engine.tokenizer, body, setup)
    plan = _chat_plan(body, setup, ids, ctx)
    return plan, ResponseShape(plan, ctx.defaults.model_id, setup)


def _chat_plan(body: Any, setup: Any, ids: list[int], ctx: _Context) -> Plan:
    """build_plan for a chat request, with the spans its `protect` segments cover (serve/segments.py)
    where it may run SpecPrefill (the spans render the chat template again: no other method pays that)."""
    notes: list[str] = []
    sparse = method_name(body, ctx.defaults) in SPECPREFILL_METHODS
    spans = protected_spans(ctx.engine.tokenizer, body, setup, ids, notes) if sparse else ()
    return build_plan("chat", body, ids, ctx.defaults, ctx.engine.context, spans, notes, setup.grammar)


def _prepare_completion(raw: bytes, ctx: _Context) -> tuple[Plan, Any]:
    body = parse_body(raw, CompletionRequest)
    check_model(body.model, ctx.defaults)
    ids = completion_prompt_ids(ctx.engine.tokenizer, body, ctx.engine.model.args.vocab_size)
    plan = build_plan("completion", body, ids, ctx.defaults, ctx.engine.context)
    return plan, ResponseShape(plan, ctx.defaults.model_id)


def _prepare_messages(raw: bytes, ctx: _Context) -> tuple[Plan, Any]:
    body, setup, ids, shown = prepare_messages(raw, ctx.engine.tokenizer, ctx.defaults)
    plan = _chat_plan(body, setup, ids, ctx)
    return plan, MessageShape(plan, ctx.defaults.model_id, setup, shown)


def _prepare_responses(raw: bytes, ctx: _Context) -> tuple[Plan, Any]:
    request, body, setup, ids, ignored = prepare_responses(raw, ctx.engine.tokenizer, ctx.defaults)
    plan = _chat_plan(body, setup, ids, ctx)
    return plan, ResponsesShape(plan, ctx.defaults.model_id, setup, request, ignored)


CHAT = Route("chat", _prepare_chat, ResponseShape.error)
COMPLETION = Route("completion", _prepare_completion, ResponseShape.error)
RESPONSES = Route("responses", _prepare_responses, ResponsesShape.error)
MESSAGES = Route("messages", _prepare_messages, anthropic_error_body)
GENERATION_ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}


def _endpoint(route: Route, ctx: _Context) -> Callable[[Request], Awaitable[Any]]:
    """The POST handler of a generation route."""

    async def answer(request: Request) -> Any:
        return await _answer(route, request, ctx)

    return answer


def _error_for(path: str) -> Callable[..., dict[str, Any]]:
    """The error body style of a path: Anthropic's under /v1/messages, OpenAI's elsewhere."""
    return anthropic_error_body if is_anthropic_path(path) else error_body


async def _answer(route: Route, request: Request, ctx: _Context) -> Any:
    try:
        try:
            raw = await _body(request, ctx.scheduler)
        except ClientDisconnect:  # gone before its body arrived: no one to answer, nothing to log
            return Response(status_code=499)
        plan, shape = route.prepare(raw, ctx)
        job = Job(plan, asyncio.get_running_loop())
        ctx.scheduler.submit(job)
    except RequestError as err:
        named = err.param is None or err.param in err.message
        ctx.metrics.record(
            Outcome(
                "req-" + uuid.uuid4().hex[:12],
                route.kind,
                str(err.status),
                err.message if named else f"{err.param}: {err.message}",
            )
        )
        return JSONResponse(
            route.error(err.status, err.message, err.param, err.code), status_code=err.status, headers=err.headers
        )
    outcome = Outcome(shape.id, route.kind, "cancelled")
    if plan.stream:
        return StreamingResponse(
            _stream(job, shape, request, outcome, ctx.metrics),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        return await _whole(job, shape, request, outcome)
    except ClientGone:  # nobody to answer: not an error to log
        return Response(status_code=499)
    except asyncio.CancelledError:
        job.cancel()
        raise
    finally:
        ctx.metrics.record(outcome)


async def _body(request: Request, scheduler: Scheduler) -> bytes:
    """The request's body; a 503 once the server is stopping while it is still arriving (a client
    stalled mid-body must not hold the shutdown: uvicorn would wait for it, then cancel it)."""
    reading = asyncio.ensure_future(request.body())
    while not (await asyncio.wait({reading}, timeout=POLL_SECONDS))[0]:
        if scheduler.closed:
            reading.cancel()
            raise RequestError(503, "the server is shutting down", code="shutting_down")
    return reading.result()


def _settle(outcome: Outcome, event: Any) -> None:
    """Fill `outcome` from a job's last event (Finished: ok; Failed: its status)."""
    if isinstance(event, Finished):
        outcome.outcome, outcome.stats = "ok", event.stats
    elif isinstance(event, Failed):
        outcome.outcome, outcome.reason = str(event.status), event.message


async def _next_event(job: Job, request: Request, deadline: float = math.inf) -> Any:
    """The job's next event, or QUIET once time.monotonic() passes `deadline` without one; checks the
    connection every POLL_SECONDS (while waiting, and between events: a busy stream never times out)
    and cancels the job once the client is gone."""
    while True:
        if time.monotonic() - job.checked >= POLL_SECONDS:
            job.checked = time.monotonic()
            if await request.is_disconnected():
                job.cancel()
                raise ClientGone
        if time.monotonic() >= deadline:
            return QUIET
        try:
            return await asyncio.wait_for(job.events.get(), timeout=POLL_SECONDS)
        except asyncio.TimeoutError:
            continue


async def _whole(job: Job, shape: Any, request: Request, outcome: Outcome) -> JSONResponse:
    while (event := await _next_event(job, request)) is not END:
        _settle(outcome, event)
        if isinstance(event, Delta):
            shape.collect(event.text)
        elif isinstance(event, Failed):
            return JSONResponse(shape.error(event.status, event.message), status_code=event.status)
        elif isinstance(event, Finished):
            return JSONResponse(shape.whole(event))
    return JSONResponse(shape.error(500, "the generation ended without a result"), status_code=500)


async def _stream(job: Job, shape: Any, request: Request, outcome: Outcome, metrics: Metrics) -> AsyncIterator[str]:
    """Server-sent events in the shape's dialect (OpenAI: role chunk, progress / text / tool-call
    chunks, final chunk(s), [DONE]; Anthropic: its message and content-block events). Errors after
    the stream began arrive as an error event (both clients raise them); a stream silent for
    KEEPALIVE_SECONDS sends the shape's keep-alive."""
    try:
        for chunk in shape.opening():
            yield chunk
        sent = time.monotonic()
        while (event := await _next_event(job, request, sent + KEEPALIVE_SECONDS)) is not END:
            if event is QUIET:
                chunks = shape.keepalive()
            else:
                _settle(outcome, event)
                chunks = shape.event(event)
            for chunk in chunks:
                yield chunk
            sent = time.monotonic() if chunks else sent
        for chunk in shape.ending():
            yield chunk
    except ClientGone:
        return
    finally:
        job.cancel()  # a no-op once the job ended; stops it if the client went away
        metrics.record(outcome)
