"""A logging pass-through in front of `specfill serve`, for watching a real agent (Claude Code, Codex
CLI) talk to the server: every request goes on to the server as it came, every answer comes back as
the server sent it (streamed answers stream through), and one JSON line per exchange is appended to
the log: time, method, path, status, seconds, the request body and the answer's body (an event
stream as its text). The server's own log says nothing of bodies; this is what docs/serve.md's agent
runs were logged with.

    python scripts/agent_log_proxy.py --upstream http://127.0.0.1:8080 --port 8081 --log agent.jsonl

then point the agent at port 8081.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

try:
    import httpx2 as httpx  # what the openai and anthropic clients bring today
except ImportError:
    import httpx  # type: ignore[no-redef]

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


def make_app(upstream: str, log: Path) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=None)

    def write(record: dict) -> None:
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")

    async def forward(request: Request) -> StreamingResponse:
        body, start = await request.body(), time.time()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        sent = client.build_request(
            request.method, request.url.path, params=request.query_params, headers=headers, content=body
        )
        answer = await client.send(sent, stream=True)
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)),
            "method": request.method,
            "path": str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
            "status": answer.status_code,
        }
        try:
            record["request"] = json.loads(body) if body else None
        except ValueError:
            record["request"] = body.decode(errors="replace")

        async def relay() -> AsyncIterator[bytes]:
            chunks: list[bytes] = []
            try:
                async for chunk in answer.aiter_raw():
                    chunks.append(chunk)
                    yield chunk
                    if await request.is_disconnected():  # the agent hung up: so does the server's stream
                        record["disconnected"] = True
                        break
            finally:
                await answer.aclose()
                record["seconds"] = round(time.time() - start, 3)
                record["answer"] = b"".join(chunks).decode(errors="replace")
                write(record)
                print(
                    f"{record['time']} {record['method']} {record['path']} {record['status']} {record['seconds']} s",
                    file=sys.stderr,
                )

        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}}
        return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)

    methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", default="http://127.0.0.1:8080", help="the specfill server")
    parser.add_argument("--port", type=int, default=8081, help="where the agent connects")
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, appended")
    args = parser.parse_args()
    uvicorn.run(make_app(args.upstream, args.log), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
