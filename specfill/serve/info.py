"""The routes around generation: the root, health, models, tokenize / detokenize, metrics, OPTIONS.

/tokenize and /detokenize take both llama.cpp's and vLLM's bodies: {"content"} or {"prompt"} or
{"messages"} (with "tools", as a chat request renders them) in, {"tokens", "count", "max_model_len"}
out; {"tokens"} in, {"content", "prompt"} (the same text under each server's key) out.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from .chat import check_template_kwargs, template_messages, tool_definitions
from .engine import Engine
from .errors import RequestError, bad_request
from .metrics import Metrics
from .plan import ServerDefaults
from .protocol import Message, read_json
from .scheduler import Scheduler


def model_not_found(name: str) -> RequestError:
    """vLLM's answer for a model the server does not serve (the openai client raises NotFoundError)."""
    return RequestError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def check_model(name: str | None, defaults: ServerDefaults) -> None:
    """An omitted model is the served one; a name not served (ServerDefaults.serves) is a 404."""
    if name is not None and not defaults.serves(name):
        raise model_not_found(name)


def add_info_routes(
    app: FastAPI, engine: Engine, defaults: ServerDefaults, scheduler: Scheduler, metrics: Metrics
) -> None:
    """Register the non-generating routes on `app`."""
    started = int(time.time())
    card = {
        "id": defaults.model_id,
        "object": "model",
        "created": started,
        "owned_by": "specfill",
        "max_model_len": engine.context,
    }

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> PlainTextResponse:
        """A liveness answer at the bare address, without a key (as Ollama's "Ollama is running"):
        Claude Code sends `HEAD /` to its base URL before its first request."""
        return PlainTextResponse("specfill is running\n")

    @app.get("/health")
    async def health() -> Any:
        """200 with "status": "ok" while the worker serves; 503 with "status": "failed" and the
        reason once it has given up (a load balancer or supervisor then restarts the process)."""
        failure = scheduler.failure
        state = {
            "status": "ok" if failure is None else "failed",
            "model": defaults.model_id,
            "busy": scheduler.running is not None,
            "waiting": scheduler.waiting(),
            "served": scheduler.served,
            "worker_restarts": scheduler.restarts,
            **engine.health(),
        }
        if failure is not None:
            return JSONResponse({**state, "reason": failure}, status_code=503)
        return state

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{**card, "id": name} for name in defaults.names()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Any:
        try:
            check_model(name, defaults)
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        return {**card, "id": name}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        try:
            data = read_json(await request.body())
            check_model(data.get("model"), defaults)
            ids = _tokenize(engine, data, defaults.chat_template_kwargs)
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.context}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        try:
            data = read_json(await request.body())
            check_model(data.get("model"), defaults)
            ids = data.get("tokens")
            vocab = engine.model.args.vocab_size
            if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < vocab for t in ids):
                raise bad_request(f"'tokens' must be a list of token ids in 0..{vocab - 1}", "tokens")
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        text = engine.tokenizer.decode(ids)
        return {"content": text, "prompt": text}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        cache = None if engine.cache is None else engine.cache.stats()
        return PlainTextResponse(
            metrics.render(scheduler.waiting(), scheduler.running is not None, cache),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.options("/{path:path}")
    async def options(path: str) -> Response:  # noqa: ARG001 - any path: CORS preflights are answered earlier
        return Response(status_code=204, headers={"Allow": "GET, POST, OPTIONS"})


def _tokenize(engine: Engine, data: dict[str, Any], template_kwargs: dict[str, Any]) -> list[int]:
    """Token ids of `content` / `prompt` (text) or `messages` (through the chat template, with the server's
    `template_kwargs` and the body's chat_template_kwargs)."""
    special = data.get("add_special", data.get("add_special_tokens"))
    if special is not None and not isinstance(special, bool):
        raise bad_request("'add_special' must be true or false", "add_special")
    if "messages" in data:
        if not isinstance(data["messages"], list) or not data["messages"]:
            raise bad_request("'messages' must be a non-empty list of messages", "messages")
        try:
            messages = [Message.model_validate(m) for m in data["messages"]]
        except ValueError:
            raise bad_request("'messages' must be a list of {role, content} objects", "messages") from None
        tools = {"tools": [dict(t) for t in tool_definitions(data["tools"])]} if data.get("tools") else {}
        variables = check_template_kwargs(data.get("chat_template_kwargs"), "chat_template_kwargs")
        rendered = engine.tokenizer.apply_chat_template(
            template_messages(messages),
            add_generation_prompt=data.get("add_generation_prompt", True) is not False,
            **{**template_kwargs, **variables, **tools},
        )
        return engine.tokenizer.encode(rendered, add_special_tokens=bool(special))
    text = data.get("content", data.get("prompt"))
    if not isinstance(text, str):
        raise bad_request("give the text as 'content' (llama.cpp) or 'prompt' (vLLM), or 'messages'", "content")
    return engine.tokenizer.encode(
        text, add_special_tokens=True if special is None and "prompt" in data else bool(special)
    )
