"""OpenAI-shaped response bodies and stream chunks for chat and text completions.

specfill adds two fields the `openai` client keeps as extras: `specfill` (statistics: method,
TTFT, kept and cached tokens, speeds) on the final chunk / the whole response, and
`prompt_progress` (llama.cpp's shape) on progress chunks, which carry no choices.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from .engine import Finished, Progress
from .plan import Plan


class ResponseShape:
    """Builds the bodies of one response (one id, one creation time, one model name)."""

    def __init__(self, plan: Plan, model_id: str):
        self.plan = plan
        self.chat = plan.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.model_id = model_id

    def _base(self, stream: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": int(self.plan.created), "model": self.model_id}

    def _choice(self, text: str | None, finish: str | None, *, stream: bool, first: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if not stream:
            return {"index": 0, "message": {"role": "assistant", "content": text or ""}, "logprobs": None,
                    "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    @staticmethod
    def usage(done: Finished) -> dict[str, Any]:
        return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "total_tokens": done.prompt_tokens + done.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}

    def whole(self, text: str, done: Finished) -> dict[str, Any]:
        """The non-streaming response."""
        return {**self._base(False), "choices": [self._choice(text, done.finish_reason, stream=False)],
                "usage": self.usage(done), "specfill": done.stats}

    def opening(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role (OpenAI's first chunk); text streams don't."""
        return {**self._base(True), "choices": [self._choice(None, None, stream=True, first=True)]} \
            if self.chat else None

    def delta(self, text: str) -> dict[str, Any]:
        return {**self._base(True), "choices": [self._choice(text, None, stream=True)]}

    def progress(self, event: Progress) -> dict[str, Any]:
        return {**self._base(True), "choices": [],
                "prompt_progress": {"total": event.total, "cache": event.cached, "processed": event.processed,
                                    "time_ms": round(event.seconds * 1000.0, 3), "stage": event.stage,
                                    "stage_processed": event.stage_processed, "stage_total": event.stage_total}}

    def closing(self, done: Finished) -> list[dict[str, Any]]:
        """The finish-reason chunk (with the statistics), then usage if stream_options asked."""
        chunks = [{**self._base(True), "choices": [self._choice(None, done.finish_reason, stream=True)],
                   "specfill": done.stats}]
        if self.plan.include_usage:
            chunks.append({**self._base(True), "choices": [], "usage": self.usage(done)})
        return chunks


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
