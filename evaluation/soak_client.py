"""One soak request on a raw socket (evaluation/soak.py): sent whole or hung up on (after a delay, at
the first prefill progress event, after a few streamed deltas, in the middle of the body), read
whole, streamed or slowly, under a deadline; its answer read from any route's body or stream.

An answer is the reply's text followed by its tool calls, one `<call NAME ARGS>` line each with the
arguments as canonical JSON (sorted keys) when they parse: the same reply gives the same answer
whether it came whole or streamed (where the stream hands out the model's own argument text).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from .soak_cases import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Case

SLOW_RCVBUF = 4096  # a slow reader's receive buffer (bytes): the server's writes back up sooner


@dataclass
class Outcome:
    """What one request got."""

    status: int | None = None  # the HTTP status (None: no response)
    answer: str | None = None
    complete: bool = False  # a whole body parsed, or a stream that reached its end event
    error: str | None = None  # an error body's message, an in-stream error, a transport error
    error_status: int | None = None  # the status an in-stream error stands for (500 / 503 / 400)
    retry_after: str | None = None
    timed_out: bool = False  # no answer within the deadline
    hung_up: str | None = None  # how the client hung up on purpose ("early", "mid-prefill", "mid-stream", "mid-body")
    seconds: float = 0.0
    first_token_s: float | None = None  # a stream's first text or tool-call delta
    calls: int = 0


def canonical(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON when they are JSON (a string of it, or an object)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def render(text: str, calls: list[tuple[str, Any]]) -> str:
    return text + "".join(f"\n<call {name} {canonical(args)}>" for name, args in calls)


def whole_answer(route: str, body: dict[str, Any]) -> str:
    """The answer of a whole (non-streamed) 200 body of `route`."""
    if route == COMPLETIONS:
        return body["choices"][0]["text"]
    if route == CHAT:
        message = body["choices"][0]["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
        return render(message.get("content") or "", calls)
    if route == MESSAGES:
        blocks = body["content"]
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        return render(text, [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"])
    if route == RESPONSES:
        text, calls = [], []
        for item in body["output"]:
            if item["type"] == "message":
                text += [p["text"] for p in item["content"] if p["type"] == "output_text"]
            elif item["type"] == "function_call":
                calls.append((item["name"], item["arguments"]))
        return render("".join(text), calls)
    raise ValueError(f"no answer reader for {route}")


def _error_status(kind: Any) -> int:
    """The status an in-stream error's type or code stands for."""
    if kind in ("server_error", "api_error"):
        return 500
    return 503 if kind == "overloaded_error" else 400


class StreamReader:
    """Server-sent events of one route, fed line by line: the answer, the end, errors, progress."""

    def __init__(self, route: str):
        self.route = route
        self.text: list[str] = []
        self.calls: dict[int, list[str]] = {}  # call index -> [name, argument pieces...]
        self.data: list[str] = []
        self.done = False
        self.error: str | None = None
        self.error_status: int | None = None
        self.progressed = False  # a prefill progress event before the whole prompt was read
        self.deltas = 0

    def line(self, raw: bytes) -> None:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            self.data.append(line[5:].strip())
        elif not line and self.data:
            data, self.data = "\n".join(self.data), []
            if data == "[DONE]":
                self.done = True
            else:
                self._event(json.loads(data))

    def _fail(self, message: str, kind: Any) -> None:
        self.error, self.error_status = message, _error_status(kind)

    def _piece(self, text: str) -> None:
        if text:
            self.deltas += 1
            self.text.append(text)

    def _call(self, index: int, name: str | None = None, arguments: str | None = None) -> None:
        call = self.calls.setdefault(index, [""])
        if name:
            call[0] = name
        if arguments:
            self.deltas += 1
            call.append(arguments)

    def _event(self, event: dict[str, Any]) -> None:
        if self.route in (CHAT, COMPLETIONS):
            if "error" in event:
                self._fail(event["error"].get("message", ""), event["error"].get("type"))
            elif "prompt_progress" in event:
                progress = event["prompt_progress"]
                self.progressed = self.progressed or progress["processed"] < progress["total"]
            for choice in event.get("choices") or []:
                if self.route == COMPLETIONS:
                    self._piece(choice.get("text") or "")
                    continue
                delta = choice.get("delta") or {}
                self._piece(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    function = call.get("function") or {}
                    self._call(call["index"], function.get("name"), function.get("arguments"))
            return
        kind = event.get("type")
        if kind == "error":
            error = event.get("error") or {}
            self._fail(error.get("message", ""), error.get("type") or error.get("code"))
        elif self.route == MESSAGES:
            if kind == "content_block_start" and event["content_block"]["type"] == "tool_use":
                self._call(event["index"], event["content_block"]["name"])
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    self._piece(delta["text"])
                elif delta["type"] == "input_json_delta":
                    self._call(event["index"], arguments=delta["partial_json"])
            elif kind == "message_stop":
                self.done = True
        elif self.route == RESPONSES:
            if kind == "response.output_text.delta":
                self._piece(event["delta"])
            elif kind == "response.output_item.added" and event["item"]["type"] == "function_call":
                self._call(event["output_index"], event["item"]["name"])
            elif kind == "response.function_call_arguments.delta":
                self._call(event["output_index"], arguments=event["delta"])
            elif kind in ("response.completed", "response.incomplete"):
                self.done = True
            elif kind == "response.failed":
                error = event["response"].get("error") or {}
                self._fail(error.get("message", ""), error.get("code"))

    def answer(self) -> str:
        calls = [(c[0], "".join(c[1:]) or "{}") for _, c in sorted(self.calls.items())]
        return render("".join(self.text), calls)


def exchange(
    host: str,
    port: int,
    case: Case,
    deadline_s: float,
    *,
    hang_up: str | None = None,
    after_s: float = 0.0,
    deltas: int = 2,
    slow_s: float = 0.0,
    release: threading.Event | None = None,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """Send `case` and read its answer within deadline_s. hang_up: "early" (close after_s seconds after
    sending, reading nothing), "mid-prefill" (at the first prefill progress event of a stream),
    "mid-stream" (after `deltas` streamed deltas, or once `release` is set); a case with a
    Content-Length lie is hung up on in the middle of its body. slow_s: sleep that long between the
    lines read (a small receive buffer too)."""
    out = Outcome()
    started = time.monotonic()
    limit = started + deadline_s
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    connection = http.client.HTTPConnection(host, port, timeout=deadline_s)
    try:
        if slow_s:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        sock.settimeout(deadline_s)
        sock.connect(address)
        connection.sock = sock
        body = case.body()
        sent = {"Content-Type": "application/json", **(headers or {})}
        if case.content_length is not None:
            sent["Content-Length"] = str(case.content_length)
        connection.request("POST", case.route, body=body, headers=sent)
        if case.content_length is not None:
            out.hung_up = "mid-body"
            return out
        if hang_up == "early":
            time.sleep(after_s)
            out.hung_up = "early"
            return out
        response = connection.getresponse()
        out.status = response.status
        out.retry_after = response.getheader("Retry-After")
        if response.status == 200 and "text/event-stream" in (response.getheader("Content-Type") or ""):
            _read_stream(response, sock, case.route, out, limit, started, hang_up, deltas, slow_s, release)
        else:
            _read_whole(response, sock, case.route, out, limit, slow_s)
    except (socket.timeout, TimeoutError):
        out.timed_out = True
    except (OSError, http.client.HTTPException) as err:
        out.error = f"{type(err).__name__}: {err}"
    finally:
        out.seconds = time.monotonic() - started
        if out.seconds > deadline_s and out.hung_up is None and not out.complete:
            out.timed_out = True
        connection.close()
        sock.close()
    return out


def _remaining(sock: socket.socket, limit: float) -> None:
    """Give the next read what is left of the deadline (a timeout at once when nothing is)."""
    left = limit - time.monotonic()
    if left <= 0:
        raise socket.timeout("deadline passed")
    sock.settimeout(left)


def _read_whole(
    response: http.client.HTTPResponse, sock: socket.socket, route: str, out: Outcome, limit: float, slow_s: float
) -> None:
    chunks = []
    while True:
        _remaining(sock, limit)
        chunk = response.read(1024 if slow_s else 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        time.sleep(slow_s)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        out.error = f"not a JSON body: {raw[:120]!r}"
        return
    if response.status == 200:
        out.answer = whole_answer(route, body)
        out.calls = out.answer.count("\n<call ")
        out.complete = True
    else:
        error = body.get("error") if isinstance(body, dict) else None
        out.error = error.get("message") if isinstance(error, dict) else str(body)[:200]
        out.complete = True


def _read_stream(
    response: http.client.HTTPResponse,
    sock: socket.socket,
    route: str,
    out: Outcome,
    limit: float,
    started: float,
    hang_up: str | None,
    deltas: int,
    slow_s: float,
    release: threading.Event | None,
) -> None:
    reader = StreamReader(route)
    while not reader.done:
        _remaining(sock, limit)
        line = response.readline()
        if not line:
            break
        seen = reader.deltas
        reader.line(line)
        if reader.deltas and not seen:
            out.first_token_s = time.monotonic() - started
        if hang_up == "mid-prefill" and reader.progressed:
            out.hung_up = hang_up
            return
        if hang_up == "mid-stream" and (reader.deltas >= deltas or (release is not None and release.is_set())):
            out.hung_up = hang_up
            return
        if slow_s:
            time.sleep(slow_s)
    out.answer, out.complete = reader.answer(), reader.done and reader.error is None
    out.calls = len(reader.calls)
    out.error, out.error_status = reader.error, reader.error_status
