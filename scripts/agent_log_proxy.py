"""A logging pass-through in front of `specfill serve`, for watching a real agent (Claude Code, Codex
CLI) talk to the server: every request goes on to the server as it came, every answer comes back as
the server sent it (streamed answers stream through), and one JSON line per exchange is appended to
the log: time, method, path, status, seconds, the request body and the answer's body (an event
stream as its text). The server's own log says nothing of bodies; this is what docs/serve.md's agent
runs were logged with.

    python scripts/agent_log_proxy.py --upstream http://127.0.0.1:8080 --port 8081 --log agent.jsonl

then point the agent at port 8081. `--summary LOG` prints the log as a Markdown table: each
generation's route, status, seconds, prompt and cached tokens, TTFT, and what came back (text, tool
calls with their arguments), read from the streamed events of the Messages and Responses APIs.
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


def _events(answer: str) -> list[dict]:
    """The JSON data of a server-sent event stream ([DONE] and comments left out)."""
    found = []
    for line in answer.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            try:
                found.append(json.loads(line[6:]))
            except ValueError:
                continue
    return found


def _reply(events: list[dict]) -> tuple[dict, str]:
    """(usage and specfill stats, what the reply said: text and calls) of a Messages, Responses or Chat Completions
    stream."""
    usage: dict = {}
    said: list[str] = []
    calls: dict[int, list[str]] = {}
    for e in events:
        kind = e.get("type", "")
        if kind == "message_start":
            usage.update(e["message"].get("usage", {}))
        elif kind == "message_delta":
            usage.update(e.get("usage", {}), specfill=e.get("specfill", {}))
        elif kind == "content_block_start" and e["content_block"]["type"] == "tool_use":
            calls[e["index"]] = [e["content_block"]["name"], ""]
        elif kind == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            calls[e["index"]][1] += e["delta"]["partial_json"]
        elif kind == "content_block_delta" and e["delta"]["type"] == "text_delta":
            said.append(e["delta"]["text"])
        elif kind == "response.output_item.done" and e["item"]["type"] == "function_call":
            calls[len(calls)] = [e["item"]["name"], e["item"]["arguments"]]
        elif kind == "response.output_text.delta":
            said.append(e["delta"])
        elif kind in ("response.completed", "response.incomplete"):
            usage.update(e["response"].get("usage") or {}, specfill=e["response"].get("specfill", {}))
        elif e.get("object") == "chat.completion.chunk":  # Chat Completions: no event type
            for choice in e.get("choices") or []:
                delta = choice.get("delta") or {}
                said.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    named = calls.setdefault(call.get("index", 0), ["", ""])  # a stream is one API's: no clash
                    function = call.get("function") or {}
                    named[0] += function.get("name") or ""
                    named[1] += function.get("arguments") or ""
            if e.get("usage"):
                chat = e["usage"]
                cached = (chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                usage.update(input_tokens=chat["prompt_tokens"] - cached, cache_read_input_tokens=cached)
            if e.get("specfill"):
                usage["specfill"] = e["specfill"]
    text = "".join(said).strip()
    parts = ([repr(text[:200])] if text else []) + [f"call {name}({arguments})" for name, arguments in calls.values()]
    return usage, "; ".join(parts) or "(nothing)"


def summary(log: Path) -> str:
    """The log as a Markdown table, one row per POST."""
    rows = [
        "| time (UTC) | route | status | s | prompt | cached | TTFT (s) | reply |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if record["method"] != "POST":
            continue
        usage, said = _reply(_events(record.get("answer", "")))
        if record["status"] >= 400:
            try:
                said = "error: " + json.loads(record.get("answer", ""))["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
        prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
        cached = usage.get("cache_read_input_tokens", (usage.get("input_tokens_details") or {}).get("cached_tokens"))
        ttft = (usage.get("specfill") or {}).get("ttft_s")
        cells = [record["time"][11:], record["path"], record["status"], record.get("seconds"), prompt, cached, ttft]
        rows.append("| " + " | ".join(str(c) for c in cells) + f" | {said.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", default="http://127.0.0.1:8080", help="the specfill server")
    parser.add_argument("--port", type=int, default=8081, help="where the agent connects")
    parser.add_argument("--log", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--summary", action="store_true", help="print the log as a Markdown table and stop")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.log), end="")
        return 0
    uvicorn.run(make_app(args.upstream, args.log), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
