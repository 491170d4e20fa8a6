"""gpt-oss's harmony format read back from a reply (mlx-lm has no parser for it; OpenAI's format
description is the reference: https://cookbook.openai.com/articles/openai-harmony).

The reply is a run of messages; the chat template's generation prompt already wrote the first
one's `<|start|>assistant`, so the reply starts with that message's header:

    <|channel|>analysis<|message|>The user wants the weather. Call the tool.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"city": "Paris"}<|call|>           (one line in the reply)

A header is everything up to `<|message|>`: the channel (`analysis`, `commentary`, `final`) and,
for a tool call, the recipient `to=functions.NAME` (before or after the channel). A body runs to
`<|end|>`, `<|call|>` or `<|return|>` (the last two end generation, so they may never arrive as text),
or to the next `<|start|>` / `<|channel|>` when the model left the end out. What each message becomes:

    a recipient          a call (`functions.` taken off the name; the body is its JSON arguments
                         object; a body that is not one comes back as the message's text)
    analysis             reasoning (Thought pieces: reasoning_content, a thinking block, a reasoning item)
    final, commentary    content (commentary without a recipient is a preamble meant for the user)

A reply that does not start with a header (the model ignored the format) is content as written.
"""

from __future__ import annotations

import re

from .reasoning import Thought
from .tool_calls import MODEL_JSON, Piece, Text, ToolCall, held

MESSAGE = "<|message|>"
START = "<|start|>"
CHANNEL = "<|channel|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")  # taken with the body
OPENERS = (START, CHANNEL)  # a new header: left for the next message
FIRST = (CHANNEL, START, MESSAGE, " to=", "to=", "<|constrain|>")  # how the reply's first header may begin
_CHANNEL = re.compile(r"<\|channel\|>\s*([\w-]+)")
_RECIPIENT = re.compile(r"(?:^|[\s>|])to=([^\s<]+)")
_TOKEN = re.compile(r"<\|[a-z_]+\|>")


class HarmonyReader:
    """Content and calls from a harmony reply fed in pieces (feed, then finish once it has ended)."""

    def __init__(self) -> None:
        self.buffer = ""
        self.mode = "first"  # first (the reply's start), header, body, plain (not harmony: all content)
        self.header = ""  # the current message's header (mode body)
        self.kind = ""  # what the current body is: call, thought or text
        self.name = ""  # the call's name (kind call)

    def feed(self, text: str) -> list[Piece]:
        self.buffer += text
        out: list[Piece] = []
        while self._step(out, final=False):
            pass
        return out

    @property
    def inside(self) -> bool:
        """Whether the reply is inside an analysis message (its reasoning) now."""
        return self.mode == "body" and self.kind == "thought"

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        if self.mode == "body":
            self._close(self.buffer, out)
        elif self.buffer.strip() and (self.mode == "plain" or not _TOKEN.search(self.buffer)):
            out.append(Text(self.buffer))  # an unfinished header that is no header: the text as written
        self.buffer, self.mode = "", "header"
        return out

    def _step(self, out: list[Piece], final: bool) -> bool:
        """Read what can be read; True when there is more to look at."""
        if self.mode == "plain":
            if self.buffer:
                out.append(Text(self.buffer))
                self.buffer = ""
            return False
        if self.mode == "first":
            head = self.buffer.lstrip()
            if any(head.startswith(o) for o in FIRST):
                self.mode = "header"
                return True
            if not final and (not head or any(o.startswith(head) for o in FIRST)):
                return False
            self.mode = "plain"
            return True
        if self.mode == "header":
            at = self.buffer.find(MESSAGE)
            if at < 0:
                return False
            self._open(self.buffer[:at])
            self.buffer = self.buffer[at + len(MESSAGE) :]
            return True
        # the body: up to the first end or opener
        cuts = [(i, m) for m in ENDS + OPENERS if (i := self.buffer.find(m)) >= 0]
        if not cuts:
            if self.kind != "call":  # text and reasoning are handed out as they come, but a marker's start waits
                keep = 0 if final else held(self.buffer, *ENDS, *OPENERS)
                ready, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
                if ready:
                    out.append(Text(ready) if self.kind == "text" else Thought(ready))
            return False
        at, marker = min(cuts)
        self._close(self.buffer[:at], out)
        self.buffer = self.buffer[at + (len(marker) if marker in ENDS else 0) :]
        self.mode = "header"
        return True

    def _open(self, header: str) -> None:
        self.header, self.mode = header, "body"
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient is not None:
            self.kind, self.name = "call", recipient.group(1).removeprefix("functions.")
        elif channel is not None and channel.group(1) == "analysis":
            self.kind = "thought"
        else:
            self.kind = "text"

    def _close(self, body: str, out: list[Piece]) -> None:
        """The end of a message: its call (a call's body is read whole here), or its last text."""
        if self.kind in ("text", "thought") and body:
            out.append(Text(body) if self.kind == "text" else Thought(body))
        elif self.kind == "call":
            try:
                arguments, end = MODEL_JSON.raw_decode(body.strip() or "{}")
                if not isinstance(arguments, dict) or body.strip()[end:].strip():
                    raise ValueError("not one JSON object")
                out.append(ToolCall(self.name, arguments))
            except ValueError:
                out.append(Text(self.header + MESSAGE + body))
        self.kind = ""
