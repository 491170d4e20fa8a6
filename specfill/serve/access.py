"""Who may call the server: an API key (Bearer) and the browser origins allowed by CORS.

Access(api_key=None, allowed_origins=()) is the default: no key, no cross-origin browser calls.
With a key every route but / and /health (and CORS preflights, which browsers send without
credentials) needs `Authorization: Bearer KEY` or `x-api-key: KEY` (the anthropic client's
header; Claude Code sends either); the comparison is constant-time (hmac) so the answer time says
nothing about how much of a guess was right. A refusal is a 401 with an OpenAI error body (an
Anthropic one under /v1/messages), which either client raises as AuthenticationError.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .errors import anthropic_error_body, error_body, is_anthropic_path

OPEN_PATHS = frozenset({"/", "/health"})  # probed without a key: by load balancers (as vLLM and llama.cpp
# allow), by Claude Code (HEAD / before its first request); neither says more than that the server runs


@dataclass(frozen=True)
class Access:
    """api_key: the Bearer token every request must carry (None: no check).
    allowed_origins: origins a browser page may call from ("*" for any; empty: none)."""

    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()


class RequireKey:
    """ASGI middleware: 401 for an HTTP request without `Authorization: Bearer <key>` or `x-api-key: <key>`."""

    def __init__(self, app: Any, key: str):
        self.app = app
        self.expected = f"Bearer {key}".encode()
        self.key = key.encode()

    async def __call__(
        self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]
    ) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given, header_key = headers.get(b"authorization", b""), headers.get(b"x-api-key", b"")
        if hmac.compare_digest(given, self.expected) | hmac.compare_digest(header_key, self.key):
            await self.app(scope, receive, send)
            return
        why = "no API key given" if not (given or header_key) else "invalid API key"
        message = f"{why}: send 'Authorization: Bearer KEY' or 'x-api-key: KEY' with the server's --api-key"
        body = json.dumps(
            anthropic_error_body(401, message)
            if is_anthropic_path(scope["path"])
            else error_body(401, message, code="invalid_api_key")
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def protect(app: Any, access: Access) -> None:
    """Add the key check and CORS to a FastAPI app (CORS outermost: its preflight answers need no key)."""
    if access.api_key is not None:
        app.add_middleware(RequireKey, key=access.api_key)
    if access.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(access.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
