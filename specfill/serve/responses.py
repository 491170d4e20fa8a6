"""OpenAI-shaped response bodies and stream chunks for chat and text completions.

specfill adds two fields the `openai` client keeps as extras: `specfill` (statistics: method,
TTFT, kept and cached tokens, speeds; `response_format`, the JSON check's verdict) on the final
chunk / the whole response, and `prompt_progress` (llama.cpp's shape) on progress chunks, which
carry no choices. A chat reply is read through the request's ReplySplitter: tool calls become
`tool_calls`, finish_reason "tool_calls"; its reasoning (reasoning.py) `reasoning_content` (llama.cpp's
and DeepSeek's field, in the message and in deltas); the rest is content. A stream hands a Hermes call out as
the model writes it (tool_stream.py): a first delta with index, id, type and the name, then pieces
of the arguments; calls in other formats come as one delta each.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .chat import ChatSetup
from .engine import Delta, Failed, Finished, Progress
from .errors import error_body
from .plan import Plan
from .reasoning import ReasoningSplitter, Thought
from .tool_parsers import Piece, ReplySplitter, Text, ToolCall
from .tool_stream import CallArgs, CallEnd, CallStart, StreamingSplitter


class Reply:
    """A reply's text read through its setup: the forced start first, then the model's text, as
    reasoning (reasoning.py), content and tool calls; keeps what it handed out (the whole response,
    the output check)."""

    def __init__(self, setup: ChatSetup, stream: bool = False):
        self.setup = setup
        names = frozenset(t["function"]["name"] for t in setup.tools)
        self.splitter = (
            StreamingSplitter(setup.format, setup.max_calls, names)
            if stream
            else ReplySplitter(setup.format, setup.max_calls)
        )
        self.thinking = None if setup.reasoning is None else ReasoningSplitter(setup.reasoning)
        self.prefix = setup.prefix
        self.content: list[str] = []
        self.thoughts: list[str] = []
        self.calls: list[ToolCall] = []
        self.pieces: list[Piece | Thought] = []  # in order, neighbours of a kind joined (Anthropic's content blocks)
        # the fed texts (the engine's deltas: a generated token's text each, or a few tokens' where the stop
        # matcher held one back) that gave reasoning text or were held inside it (the markers that open and
        # close it not counted): usage's reasoning_tokens
        self.reasoning_steps = 0

    def feed(self, text: str) -> list[Any]:
        """The pieces the text gives: Thought, Text and ToolCall, and a stream's CallStart / CallArgs / CallEnd."""
        text, self.prefix = self.prefix + text, ""
        inside = self._inside()
        pieces = self._read(self.thinking.feed(text) if self.thinking is not None else [text])
        if any(isinstance(p, Thought) for p in pieces) or (inside and self._inside()):  # gave reasoning, or held in it
            self.reasoning_steps += 1
        return pieces

    def reasoning_tokens(self, generated: int) -> int:
        """Usage's reasoning_tokens of a reply of `generated` tokens (its reasoning_steps, at most all)."""
        return min(self.reasoning_steps, generated)

    def _inside(self) -> bool:
        """Whether the reply is inside its reasoning now (thinking tags, or a harmony analysis message)."""
        harmony = self.splitter.harmony
        return (self.thinking is not None and self.thinking.inside) or (harmony is not None and harmony.inside)

    def finish(self) -> list[Any]:
        """The pieces held back until the end (the forced start too, if no text ever came)."""
        text, self.prefix = self.prefix, ""
        parts = [text] if self.thinking is None else self.thinking.feed(text) + self.thinking.finish()
        return self._read(parts) + self._keep(self.splitter.finish())

    def _read(self, parts: list[Thought | str]) -> list[Any]:
        """Reasoning as it is; the content through the tool-call splitter."""
        out: list[Any] = []
        for part in parts:
            out += self._keep([part] if isinstance(part, Thought) else self.splitter.feed(part))
        return out

    def _keep(self, pieces: list[Any]) -> list[Any]:
        for piece in pieces:
            if isinstance(piece, CallEnd) and piece.call is not None:
                piece = piece.call
            elif isinstance(piece, (CallStart, CallArgs, CallEnd)):
                continue
            if isinstance(piece, Text):
                self.content.append(piece.text)
            elif isinstance(piece, Thought):
                self.thoughts.append(piece.text)
            else:
                self.calls.append(piece)
            last = self.pieces[-1] if self.pieces else None
            if isinstance(piece, (Text, Thought)) and type(last) is type(piece):
                self.pieces[-1] = type(piece)(last.text + piece.text)
            else:
                self.pieces.append(piece)
        return pieces

    def text(self) -> str:
        return "".join(self.content)

    def reasoning(self) -> str | None:
        """The reply's reasoning (None: it had none)."""
        return "".join(self.thoughts) if self.thoughts else None

    def verdict(self) -> dict[str, Any] | None:
        """The response_format check of the finished reply (None: no check, or the reply is calls)."""
        check = self.setup.output
        if check is None or self.calls:
            return None
        error = check.check(self.text())
        return {"type": check.kind, "valid": error is None, "error": error}


def call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


class ResponseShape:
    """Builds the bodies of one response (one id, one creation time, one model name)."""

    def __init__(self, plan: Plan, model_id: str, setup: ChatSetup | None = None):
        self.plan = plan
        self.chat = plan.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.model_id = model_id
        self.reply = Reply(setup or ChatSetup(), plan.stream)
        self.sent_calls = 0

    def _base(self, stream: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": int(self.plan.created), "model": self.model_id}

    def _choice(
        self,
        text: str | None,
        finish: str | None,
        *,
        stream: bool,
        first: bool = False,
        calls: list[dict[str, Any]] | None = None,
        thought: str = "",
    ) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": text or ("" if not calls else None)}
            if (reasoning := self.reply.reasoning()) is not None:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = calls
            return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if thought:
            delta["reasoning_content"] = thought
        if text:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    @staticmethod
    def _call(call: ToolCall) -> dict[str, Any]:
        return {
            "id": call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }

    def usage(self, done: Finished) -> dict[str, Any]:
        """With completion_tokens_details.reasoning_tokens (OpenAI's field) where the reply reasoned
        (Reply.reasoning_steps)."""
        usage = {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
        }
        if self.reply.reasoning_steps:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": self.reply.reasoning_tokens(done.completion_tokens)
            }
        return usage

    def _finish_reason(self, done: Finished) -> str:
        return "tool_calls" if self.reply.calls and done.finish_reason == "stop" else done.finish_reason

    def _stats(self, done: Finished) -> dict[str, Any]:
        verdict = self.reply.verdict()
        return done.stats if verdict is None else {**done.stats, "response_format": verdict}

    @staticmethod
    def error(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        return error_body(status, message, param=param, code=code)

    # the whole response
    def collect(self, text: str) -> None:
        self.reply.feed(text)

    def whole(self, done: Finished) -> dict[str, Any]:
        """The non-streaming response."""
        self.reply.finish()
        calls = [self._call(c) for c in self.reply.calls]
        return {
            **self._base(False),
            "choices": [self._choice(self.reply.text(), self._finish_reason(done), stream=False, calls=calls)],
            "usage": self.usage(done),
            "specfill": self._stats(done),
        }

    # the stream
    def opening(self) -> list[str]:
        """Chat streams open with the assistant role (OpenAI's first chunk); text streams don't."""
        return (
            [sse({**self._base(True), "choices": [self._choice(None, None, stream=True, first=True)]})]
            if self.chat
            else []
        )

    def event(self, event: Any) -> list[str]:
        """The chunks one engine event turns into."""
        if isinstance(event, Progress):
            return [sse(self.progress(event))]
        if isinstance(event, Delta):
            return [sse(c) for c in self._pieces(self.reply.feed(event.text))]
        if isinstance(event, Finished):
            return [sse(c) for c in self._pieces(self.reply.finish()) + self.closing(event)]
        if isinstance(event, Failed):
            return [sse(error_body(event.status, event.message))]
        return []

    @staticmethod
    def keepalive() -> list[str]:
        """What a silent stream sends: an SSE comment, which clients skip (as OpenRouter sends)."""
        return [": keep-alive\n\n"]

    @staticmethod
    def ending() -> list[str]:
        return [sse("[DONE]")]

    def _pieces(self, pieces: list[Any]) -> list[dict[str, Any]]:
        chunks = []
        for piece in pieces:
            if isinstance(piece, Text):
                chunks.append(self.delta(piece.text))
                continue
            if isinstance(piece, Thought):
                chunks.append(
                    {**self._base(True), "choices": [self._choice(None, None, stream=True, thought=piece.text)]}
                )
                continue
            if isinstance(piece, CallStart):
                function = {"name": piece.name, "arguments": ""}
                call = {"index": self.sent_calls, "id": call_id(), "type": "function", "function": function}
            elif isinstance(piece, CallArgs):
                call = {"index": self.sent_calls, "function": {"arguments": piece.text}}
            elif isinstance(piece, CallEnd):
                self.sent_calls += 1
                continue
            else:
                call = {"index": self.sent_calls, **self._call(piece)}
                self.sent_calls += 1
            chunks.append({**self._base(True), "choices": [self._choice(None, None, stream=True, calls=[call])]})
        return chunks

    def delta(self, text: str) -> dict[str, Any]:
        return {**self._base(True), "choices": [self._choice(text, None, stream=True)]}

    def progress(self, event: Progress) -> dict[str, Any]:
        return {
            **self._base(True),
            "choices": [],
            "prompt_progress": {
                "total": event.total,
                "cache": event.cached,
                "processed": event.processed,
                "time_ms": round(event.seconds * 1000.0, 3),
                "stage": event.stage,
                "stage_processed": event.stage_processed,
                "stage_total": event.stage_total,
            },
        }

    def closing(self, done: Finished) -> list[dict[str, Any]]:
        """The finish-reason chunk (with the statistics), then usage if stream_options asked."""
        chunks = [
            {
                **self._base(True),
                "choices": [self._choice(None, self._finish_reason(done), stream=True)],
                "specfill": self._stats(done),
            }
        ]
        if self.plan.include_usage:
            chunks.append({**self._base(True), "choices": [], "usage": self.usage(done)})
        return chunks


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One server-sent event (named, for Anthropic's stream)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
