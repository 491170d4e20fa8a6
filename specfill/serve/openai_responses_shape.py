"""The Response object of POST /v1/responses (OpenAI's Responses API; the request: openai_responses.py),
whole or as its event stream.

The reply is read by the chat route's Reply (its ReplySplitter / StreamingSplitter) and shaped as a
Response object (`reasoning` items with one `reasoning_text` part (reasoning.py), `message` items with
one `output_text` part, `function_call` items, `usage` with
`input_tokens_details.cached_tokens`, specfill's statistics), or as the event stream: response.created,
response.in_progress, per item response.output_item.added, (message) response.content_part.added,
response.output_text.delta ..., response.output_text.done, response.content_part.done, (reasoning)
the same with response.reasoning_text.delta / .done, (call)
response.function_call_arguments.delta ..., response.function_call_arguments.done, then
response.output_item.done; last response.completed (response.incomplete when max_output_tokens
cut the reply; response.failed on an error after the stream began), each with its sequence_number.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .chat import ChatSetup
from .engine import Delta, Failed, Finished
from .errors import error_body
from .openai_responses import ResponsesRequest
from .plan import Plan
from .reasoning import Thought
from .responses import Reply, sse
from .tool_parsers import Text, ToolCall
from .tool_stream import CallArgs, CallEnd, CallStart

PARTS = {"message": "output_text", "reasoning": "reasoning_text"}  # an item with a text part -> the part's events


def _hex() -> str:
    return uuid.uuid4().hex[:24]


class ResponsesShape:
    """The body of one Responses response, whole or as the Responses event stream."""

    @staticmethod
    def error(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
        return error_body(status, message, param=param, code=code)

    def __init__(self, plan: Plan, model_id: str, setup: ChatSetup, request: ResponsesRequest, ignored: list[str]):
        self.plan = plan
        self.id = "resp_" + _hex()
        self.model_id = model_id
        self.request = request
        self.ignored = ignored
        self.reply = Reply(setup, plan.stream)
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items so far (the last one may be open)
        self.open: dict[str, Any] | None = None  # the item open now

    # the Response object
    def _response(self, status: str, done: Finished | None = None, error: dict[str, Any] | None = None) -> dict:
        request = self.request
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": int(self.plan.created),
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": self.model_id,
            "output": list(self.output),
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": (request.reasoning or {}).get("effort"), "summary": None},
            "store": False,
            "temperature": request.temperature,
            "text": request.text or {"format": {"type": "text"}},
            "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
            "tools": request.tools or [],
            "top_p": request.top_p,
            "truncation": "disabled",
            "usage": None,
            "metadata": request.metadata or {},
        }
        if done is not None:
            body["usage"] = self.usage(done)
            verdict = self.reply.verdict()
            stats = done.stats if verdict is None else {**done.stats, "response_format": verdict}
            body["specfill"] = {**stats, "ignored_tools": self.ignored} if self.ignored else stats
        return body

    def usage(self, done: Finished) -> dict[str, Any]:
        """input_tokens count the whole prompt; cached_tokens, the part read from the prompt cache;
        reasoning_tokens, the generated tokens read as reasoning (Reply.reasoning_steps)."""
        return {
            "input_tokens": done.prompt_tokens,
            "input_tokens_details": {"cached_tokens": done.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": done.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reply.reasoning_tokens(done.completion_tokens)},
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        }

    @staticmethod
    def _status(done: Finished) -> str:
        return "incomplete" if done.finish_reason == "length" else "completed"

    @staticmethod
    def _message(text: str, status: str = "completed") -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": "msg_" + _hex(), "type": "message", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def _reasoning(text: str, status: str = "completed") -> dict[str, Any]:
        content = [{"type": "reasoning_text", "text": text}]
        return {"id": "rs_" + _hex(), "type": "reasoning", "status": status, "summary": [], "content": content}

    @staticmethod
    def _function_call(name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
        return {
            "id": "fc_" + _hex(),
            "type": "function_call",
            "status": status,
            "call_id": "call_" + _hex(),
            "name": name,
            "arguments": arguments,
        }

    # the whole response
    def collect(self, text: str) -> None:
        self.reply.feed(text)

    def whole(self, done: Finished) -> dict[str, Any]:
        self.reply.finish()
        for piece in self.reply.pieces:
            if isinstance(piece, Text):
                self.output.append(self._message(piece.text))
            elif isinstance(piece, Thought):
                self.output.append(self._reasoning(piece.text))
            else:
                self.output.append(self._function_call(piece.name, json.dumps(piece.arguments, ensure_ascii=False)))
        if not self.output:
            self.output.append(self._message(""))
        return self._response(self._status(done), done)

    # the stream
    def _event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(body, kind)

    def opening(self) -> list[str]:
        response = self._response("in_progress")
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def keepalive(self) -> list[str]:
        """What a silent stream sends: response.in_progress again, the response as it stands (an event,
        not an SSE comment: Codex's idle timeout counts events)."""
        return [self._event("response.in_progress", response=self._response("in_progress"))]

    @staticmethod
    def ending() -> list[str]:
        return []

    def _add(self, item: dict[str, Any]) -> list[str]:
        """Open `item` (closing the open one)."""
        out = self._close()
        self.open = item
        self.output.append(item)
        index = len(self.output) - 1
        out.append(
            self._event(
                "response.output_item.added",
                output_index=index,
                item={**item, "content": []} if item["type"] in PARTS else item,
            )
        )
        if item["type"] in PARTS:
            part = {**item["content"][0], "text": ""}
            out.append(
                self._event(
                    "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            )
        return out

    def _close(self, status: str = "completed") -> list[str]:
        """Close the open item: its text / arguments done, then the item."""
        item, self.open = self.open, None
        if item is None:
            return []
        index, out = len(self.output) - 1, []
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] in PARTS:
            part = item["content"][0]
            logprobs = {"logprobs": []} if item["type"] == "message" else {}
            done = f"response.{PARTS[item['type']]}.done"
            out.append(self._event(done, **where, content_index=0, text=part["text"], **logprobs))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        else:
            out.append(self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]))
        item["status"] = status
        return out + [self._event("response.output_item.done", output_index=index, item=item)]

    def _text(self, text: str, kind: str = "message") -> list[str]:
        """Text into the open item of `kind` (message, reasoning), opened if another is open."""
        out = []
        if self.open is None or self.open["type"] != kind:
            out = self._add(
                self._message("", "in_progress") if kind == "message" else self._reasoning("", "in_progress")
            )
        assert self.open is not None
        self.open["content"][0]["text"] += text
        where = {"item_id": self.open["id"], "output_index": len(self.output) - 1, "content_index": 0}
        logprobs = {"logprobs": []} if kind == "message" else {}
        return out + [self._event(f"response.{PARTS[kind]}.delta", **where, delta=text, **logprobs)]

    def _arguments(self, text: str) -> str:
        assert self.open is not None
        self.open["arguments"] += text
        where = {"item_id": self.open["id"], "output_index": len(self.output) - 1}
        return self._event("response.function_call_arguments.delta", **where, delta=text)

    def _pieces(self, pieces: list[Any]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, Text):
                out += self._text(piece.text)
            elif isinstance(piece, Thought):
                out += self._text(piece.text, "reasoning")
            elif isinstance(piece, CallStart):
                out += self._add(self._function_call(piece.name, "", "in_progress"))
            elif isinstance(piece, CallArgs):
                out.append(self._arguments(piece.text))
            elif isinstance(piece, CallEnd):  # a call cut short keeps what it streamed, as on the other routes
                out += self._close("completed" if piece.call is not None else "incomplete")
            elif isinstance(piece, ToolCall):
                out += self._add(self._function_call(piece.name, "", "in_progress"))
                out.append(self._arguments(json.dumps(piece.arguments, ensure_ascii=False)))
                out += self._close()
        return out

    def event(self, event: Any) -> list[str]:
        """The events one engine event turns into."""
        if isinstance(event, Delta):
            return self._pieces(self.reply.feed(event.text))
        if isinstance(event, Finished):
            out = self._pieces(self.reply.finish())
            if not self.output:
                out += self._add(self._message("", "in_progress"))
            out += self._close()
            status = self._status(event)
            return out + [self._event(f"response.{status}", response=self._response(status, event))]
        if isinstance(event, Failed):
            code = "server_error" if event.status >= 500 else "invalid_prompt"
            out = self._close("incomplete")
            error = {"code": code, "message": event.message}
            return out + [self._event("response.failed", response=self._response("failed", error=error))]
        return []  # Started, Progress: the Responses stream has no place for prefill progress
