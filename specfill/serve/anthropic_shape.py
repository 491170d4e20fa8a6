"""The body of one Anthropic Messages response (the request: anthropic.py), whole or as Anthropic's event
stream: content blocks (text; the reasoning as a `thinking` block, with an empty signature, or with its text
hidden in the signature when the request asks `thinking.display` "omitted", whence a later request's block
gives it back; tool_use), stop_reason, usage with cache_read_input_tokens from the prompt cache; streamed:
message_start, per block content_block_start / content_block_delta (text_delta, thinking_delta then
signature_delta, input_json_delta) / content_block_stop, message_delta (stop_reason, usage), message_stop.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from .chat import ChatSetup
from .engine import Delta, Failed, Finished, Started
from .errors import anthropic_error_body
from .plan import Plan
from .reasoning import Thought
from .responses import Reply, sse
from .tool_parsers import Text, ToolCall
from .tool_stream import CallArgs, CallEnd, CallStart

SIGNED = "specfill:"  # a signature that carries a hidden thinking block's text (base64 of its UTF-8)


def signature(text: str) -> str:
    return SIGNED + base64.b64encode(text.encode()).decode() if text else ""


def signed(value: Any) -> str:
    """The text a signature of ours carries ("" for any other: a signature is opaque to everyone else)."""
    if not isinstance(value, str) or not value.startswith(SIGNED):
        return ""
    try:
        return base64.b64decode(value[len(SIGNED) :], validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return ""


def tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


class MessageShape:
    """The body of one Messages response, whole or as Anthropic's event stream."""

    error = staticmethod(anthropic_error_body)

    def __init__(self, plan: Plan, model_id: str, setup: ChatSetup, shown: bool = True):
        self.plan = plan
        self.shown = shown  # False (thinking.display "omitted"): a thinking block's text travels in its signature
        self.thought = ""  # the open thinking block's text, held for its signature when not shown
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model_id = model_id
        self.reply = Reply(setup, plan.stream)
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: str | None = None  # the type of the block open now

    @staticmethod
    def usage(prompt: int, cached: int, output: int) -> dict[str, Any]:
        """Anthropic's usage: input_tokens are the prompt tokens not read from the cache."""
        return {
            "input_tokens": prompt - cached,
            "output_tokens": output,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }

    def _stop(self, done: Finished) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence)."""
        if done.stop is not None:
            return "stop_sequence", done.stop
        if done.finish_reason == "length":
            return "max_tokens", None
        return ("tool_use" if self.reply.calls else "end_turn"), None

    def _message(
        self, content: list[dict[str, Any]], stop: tuple[str | None, str | None], usage: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model_id,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": usage,
        }

    def _thinking(self, text: str) -> dict[str, Any]:
        """A thinking block: its text shown, or (display "omitted") in its signature, whence it comes back."""
        if self.shown:
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "thinking", "thinking": "", "signature": signature(text)}

    @staticmethod
    def _tool_use(call: ToolCall) -> dict[str, Any]:
        return {"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": call.arguments}

    # the whole response
    def collect(self, text: str) -> None:
        self.reply.feed(text)

    def whole(self, done: Finished) -> dict[str, Any]:
        self.reply.finish()
        content: list[dict[str, Any]] = []
        for piece in self.reply.pieces:
            if isinstance(piece, Text):
                content.append({"type": "text", "text": piece.text})
            elif isinstance(piece, Thought):
                content.append(self._thinking(piece.text))
            else:
                content.append(self._tool_use(piece))
        body = self._message(
            content or [{"type": "text", "text": ""}],
            self._stop(done),
            self.usage(done.prompt_tokens, done.cached_tokens, done.completion_tokens),
        )
        return {**body, "specfill": self._stats(done)}

    def _stats(self, done: Finished) -> dict[str, Any]:
        verdict = self.reply.verdict()
        return done.stats if verdict is None else {**done.stats, "response_format": verdict}

    # the stream
    @staticmethod
    def opening() -> list[str]:
        return []

    @staticmethod
    def keepalive() -> list[str]:
        """What a silent stream sends: Anthropic's ping event (its SDKs skip it; the bytes count)."""
        return [sse({"type": "ping"}, "ping")]

    @staticmethod
    def ending() -> list[str]:
        return []

    def _start(self, cached: int) -> list[str]:
        if self.started:
            return []
        self.started = True
        usage = self.usage(len(self.plan.ids), cached, 0)
        return [
            sse({"type": "message_start", "message": self._message([], (None, None), usage)}, "message_start"),
            sse({"type": "ping"}, "ping"),
        ]

    def _close_block(self) -> list[str]:
        if self.open is None:
            return []
        # a thinking block ends with its signature: empty, or the hidden text (thinking.display "omitted")
        signed = []
        if self.open == "thinking":
            signed = [self._delta({"type": "signature_delta", "signature": self._thinking(self.thought)["signature"]})]
            self.thought = ""
        self.open = None
        return signed + [sse({"type": "content_block_stop", "index": self.blocks - 1}, "content_block_stop")]

    def _open_block(self, block: dict[str, Any]) -> list[str]:
        out = self._close_block()
        self.open, self.blocks = block["type"], self.blocks + 1
        return out + [
            sse(
                {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}, "content_block_start"
            )
        ]

    def _delta(self, delta: dict[str, Any]) -> str:
        return sse({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}, "content_block_delta")

    def _pieces(self, pieces: list[Any]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, Text):
                if self.open != "text":
                    out += self._open_block({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": piece.text}))
            elif isinstance(piece, Thought):
                if self.open != "thinking":
                    out += self._open_block({"type": "thinking", "thinking": "", "signature": ""})
                if self.shown:
                    out.append(self._delta({"type": "thinking_delta", "thinking": piece.text}))
                else:
                    self.thought += piece.text
            elif isinstance(piece, CallStart):
                out += self._open_block({"type": "tool_use", "id": tool_use_id(), "name": piece.name, "input": {}})
            elif isinstance(piece, CallArgs):
                out.append(self._delta({"type": "input_json_delta", "partial_json": piece.text}))
            elif isinstance(piece, CallEnd):
                out += self._close_block()
            else:
                block = self._tool_use(piece)
                out += self._open_block({**block, "input": {}})
                out.append(
                    self._delta(
                        {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
                    )
                )
                out += self._close_block()
        return out

    def event(self, event: Any) -> list[str]:
        """The events one engine event turns into."""
        if isinstance(event, Started):
            return self._start(event.cached)
        if isinstance(event, Delta):
            return self._start(0) + self._pieces(self.reply.feed(event.text))
        if isinstance(event, Finished):
            out = self._start(event.cached_tokens) + self._pieces(self.reply.finish())
            if not self.blocks:
                out += self._open_block({"type": "text", "text": ""})
            out += self._close_block()
            stop_reason, stop_sequence = self._stop(event)
            usage = self.usage(event.prompt_tokens, event.cached_tokens, event.completion_tokens)
            delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            out.append(
                sse(
                    {"type": "message_delta", "delta": delta, "usage": usage, "specfill": self._stats(event)},
                    "message_delta",
                )
            )
            return out + [sse({"type": "message_stop"}, "message_stop")]
        if isinstance(event, Failed):
            return [sse(anthropic_error_body(event.status, event.message), "error")]
        return []
