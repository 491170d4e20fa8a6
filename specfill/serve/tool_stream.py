"""A tool call's arguments streamed as the model writes them (issue 37): the pieces a streamed call
becomes, the call's header read from the first characters of its body, and a JSON-prefix check.

A Hermes / Qwen call body starts `{"name": "NAME", "arguments": {` (or "parameters"). Once that
header is complete and NAME is one of the request's tools, the call is announced (CallStart) and
the arguments object is handed out in pieces (CallArgs) for as long as the text is the start of a
JSON object, checked character by character (tool_calls.JsonPrefix): every piece a client has seen joins to a
valid JSON prefix, which Anthropic's client parses after each delta. Anything else (another key
order, a list of calls, arguments as a string, Qwen3-Coder's <function=...> body, an unknown
name) is read whole once the call closes, as before. The rules for a call that breaks after it was
announced are ReplySplitter's (tool_parsers.py) and docs/serve.md's.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from typing import Any

from .tool_calls import JsonPrefix, Text, ToolCall, held, loads
from .tool_parsers import ReplySplitter, ToolFormat


@dataclass(frozen=True)
class CallStart:
    """A streamed call begins: its name is known, its arguments follow."""

    name: str


@dataclass(frozen=True)
class CallArgs:
    """The next piece of the streamed call's arguments (JSON text)."""

    text: str


@dataclass(frozen=True)
class CallEnd:
    """The streamed call is over: the call (None: its arguments did not complete)."""

    call: ToolCall | None


_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.:-")
_HEADER_STEPS = (("{",), ('"name"',), (":",), ('"',), None, (",",), ('"arguments"', '"parameters"'), (":",), ("{",))


def call_header(body: str, names: frozenset[str] | None = None) -> tuple[str, int] | bool | None:
    """(name, where the arguments' '{' is) when `body` starts with a call's header; None while it
    still may; False when it cannot (or names the call something not in `names`)."""
    pos, name = 0, ""
    for step in _HEADER_STEPS:
        if step is None:  # the name, up to its closing quote (no white space skipped inside the string)
            end = pos
            while end < len(body) and body[end] in _NAME_CHARS:
                end += 1
            if end == len(body):
                return None
            if body[end] != '"' or not 0 < end - pos <= 64:
                return False
            name, pos = body[pos:end], end + 1
            continue
        while pos < len(body) and body[pos].isspace():
            pos += 1
        rest = body[pos:]
        if not rest:
            return None
        matched = next((o for o in step if rest.startswith(o)), None)
        if matched is None:
            return None if any(o.startswith(rest) for o in step) else False
        pos += len(matched)
    if names is not None and name not in names:
        return False
    return name, pos - 1


@dataclass
class _Live:
    """The call being streamed: its name, where its arguments start, how far they are checked."""

    name: str
    start: int
    pos: int
    json: JsonPrefix = field(default_factory=JsonPrefix)


def _closes_call(tail: str) -> bool:
    """Whether the text after a call's arguments is the rest of its object (the '}', other keys)."""
    try:
        json.loads('{"arguments": 0' + tail)
    except ValueError:
        return False
    return True


class StreamingSplitter(ReplySplitter):
    """ReplySplitter for a streamed reply: a Hermes call with a header (call_header) is handed out
    as CallStart, CallArgs pieces and CallEnd; every other call is read whole, as ReplySplitter does.

    A streamed call whose arguments stop being JSON ends there (CallEnd(None)) and the text from
    that character on is content; one cut short (a stop string, max_tokens, the end of the reply, a
    closing tag inside the object) ends with the arguments it streamed (CallEnd(None)). Text after
    the arguments other than the closing '}' comes back as content."""

    def __init__(self, fmt: ToolFormat | None, max_calls: int | None = None, names: frozenset[str] | None = None):
        super().__init__(fmt, max_calls)
        self.names = names
        self.live: _Live | None = None
        self.undecided = False  # inside a call whose header is still being read

    def _step(self, out: list[Any]) -> bool:
        if self.live is not None:
            return self._stream(out, final=False)
        if self.body is not None and self.undecided:
            assert self.fmt is not None and self.fmt.end is not None
            text, self.pending = self.body + self.pending, ""
            self.body = text
            cut = self.fmt.end_at(text)
            head = call_header(text if cut < 0 else text[:cut], self.names)
            if head is None and cut < 0:
                return False
            self.undecided = False
            if isinstance(head, tuple) and (self.max_calls is None or self.calls < self.max_calls):
                name, at = head
                self.live = _Live(name, at, at)
                self.calls += 1
                out.append(CallStart(name))
            return True
        opened = self.body is None
        more = super()._step(out)
        if opened and self.body is not None:
            self.undecided = self.fmt is not None and self.fmt.streamed
        return more

    def _end(self) -> list[Any]:
        out: list[Any] = []
        if self.live is not None:
            self._stream(out, final=True)
        return out + super()._end()

    def _stream(self, out: list[Any], final: bool) -> bool:
        live, fmt = self.live, self.fmt
        end = fmt.end if fmt is not None else None
        assert live is not None and fmt is not None and end is not None and self.body is not None
        body, self.pending = self.body + self.pending, ""
        self.body = body
        cut = fmt.end_at(body)
        limit = cut if cut >= 0 else len(body) if final else len(body) - held(body, end)
        begin = live.pos
        while live.pos < limit and not live.json.done and live.json.feed(body[live.pos]):
            live.pos += 1
        if live.pos > begin:
            out.append(CallArgs(body[begin : live.pos]))
        if not live.json.done and live.pos < limit:  # not JSON from here: the call ends, the rest is content
            out.append(CallEnd(None))
            self.pending, self.body, self.live = body[live.pos :], None, None
            return True
        if cut < 0 and not final:
            return False
        call = None
        if live.json.done:
            try:
                call = ToolCall(live.name, loads(body[live.start : live.pos]))
            except ValueError:
                call = None
        out.append(CallEnd(call))
        extra = body[live.pos : cut if cut >= 0 else len(body)].strip()
        if extra and not _closes_call(extra):
            out.append(Text(extra))
        self.pending = body[cut + len(end) :] if cut >= 0 else ""
        self.body, self.live = None, None
        return True
