"""What a reply's tool calls are made of, shared by the format readers (tool_parsers.py,
tool_mlx.py, tool_harmony.py) and the streamed reading (tool_stream.py): a call (ToolCall), the
reply's other text (Text), a call object read from JSON (as_call, json_calls), a check that
text is the start of one JSON value (JsonPrefix), and one that a reply is nothing but a JSON call
(JsonOnly); and how much of a streamed text to hold back while it may be a marker's start (held:
the readers', reasoning.py's and the stop strings').
"""

from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass
from typing import Any, Union


def held(text: str, *markers: str) -> int:
    """How many of text's last characters may be the start of one of the markers."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Text:
    text: str


Piece = Union[Text, ToolCall]


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a double's range: not a JSON number a client can read")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


MODEL_JSON = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
"""The decoder for JSON a model wrote: json's, except that NaN, Infinity and a number past a double's
range (1e999) are ValueErrors, not floats no JSON response could carry (json.dumps refuses them)."""


def loads(text: str) -> Any:
    """JSON a model wrote, by MODEL_JSON (json.loads's white space rules)."""
    return MODEL_JSON.decode(text)


def check_finite(value: Any) -> Any:
    """`value` (a parsed JSON value from elsewhere: mlx-lm's parsers) if every number in it is
    finite; ValueError otherwise."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a JSON number")
    for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        check_finite(item)
    return value


def as_call(value: Any) -> ToolCall:
    """One {"name", "arguments" | "parameters"} object as a call; ValueError for anything else
    (arguments may come as a JSON string of an object, as some templates render them)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ValueError("not a tool call object")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = loads(arguments or "{}")
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments are not an object")
    return ToolCall(value["name"], check_finite(arguments))


def json_calls(text: str) -> list[ToolCall]:
    """Calls from JSON values in a row (objects, or lists of them), separated by white space, ';'
    or ','; ValueError if anything else is there."""
    decoder, pos = MODEL_JSON, 0
    calls: list[ToolCall] = []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in ";,"):
            pos += 1
        if pos == len(text):
            return calls
        value, pos = decoder.raw_decode(text, pos)
        calls.extend(as_call(v) for v in (value if isinstance(value, list) else [value]))


_NUMBER_START = re.compile(r"-?(0|[1-9]\d*)?(\.\d*)?([eE][+-]?\d*)?")
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_LITERALS = ("true", "false", "null")


class JsonPrefix:
    """Whether the characters fed so far are the start of one JSON value; `done` once it is whole.

    feed(ch) is False for the first character that no JSON text could continue with (that
    character is not taken). A number is checked in full when the character after it comes."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # open containers, "{" or "["
        self.state = "value"
        self.word = ""  # the number or literal being read
        self.key = False  # the string being read is an object key
        self.hex = 0  # \\u digits still to come
        self.done = False

    def _complete(self) -> None:
        self.state = "after"
        self.done = not self.stack

    def feed(self, ch: str) -> bool:
        if self.done:
            return False
        state = self.state
        if state == "string":
            if ch == '"':
                if self.key:
                    self.state = "colon"
                else:
                    self._complete()
            elif ch == "\\":
                self.state = "escape"
            elif ord(ch) < 0x20:
                return False
            return True
        if state == "escape":
            if ch == "u":
                self.state, self.hex = "hex", 4
            elif ch in '"\\/bfnrt':
                self.state = "string"
            else:
                return False
            return True
        if state == "hex":
            if ch not in string.hexdigits:
                return False
            self.hex -= 1
            self.state = "string" if self.hex == 0 else "hex"
            return True
        if state == "number":
            if ch in "0123456789+-.eE" and _NUMBER_START.fullmatch(self.word + ch):
                self.word += ch
                return True
            if not _NUMBER.fullmatch(self.word):
                return False
            self._complete()
            return self.feed(ch)
        if state == "literal":
            word = self.word + ch
            if not any(w.startswith(word) for w in _LITERALS):
                return False
            self.word = word
            if word in _LITERALS:
                self._complete()
            return True
        if ch.isspace():
            return True
        if state == "colon":
            self.state = "value"
            return ch == ":"
        if state in ("first_key", "key"):
            if ch == "}" and state == "first_key":
                self.stack.pop()
                self._complete()
                return True
            if ch != '"':
                return False
            self.state, self.key = "string", True
            return True
        if state == "after":
            top = self.stack[-1] if self.stack else None
            if ch == "," and top is not None:
                self.state = "key" if top == "{" else "value"
                return True
            if (ch, top) in (("}", "{"), ("]", "[")):
                self.stack.pop()
                self._complete()
                return True
            return False
        if state == "first_value" and ch == "]":  # state: a value may start here
            self.stack.pop()
            self._complete()
            return True
        if ch in "{[":
            self.stack.append(ch)
            self.state = "first_key" if ch == "{" else "first_value"
        elif ch == '"':
            self.state, self.key = "string", False
        elif ch == "-" or ch.isdigit():
            self.state, self.word = "number", ch
        elif ch in "tfn":
            self.state, self.word = "literal", ch
        else:
            return False
        return True


_FENCE_LINE = re.compile(r"`{1,3}|```[\w-]*[ \t]*\n?")


class JsonOnly:
    """Whether a reply is nothing but a JSON call: one object or a list of them, bare or inside one
    ``` fence (```json ... ```, the closing fence may be missing), white space around it. feed() is
    False from the first character that no such reply could go on with; calls() reads it whole."""

    def __init__(self) -> None:
        self.text = ""
        self.stage = "lead"  # lead, fence (its first line), inner (after it), json, tail (after the value)
        self.fence = 0  # where the fence starts (-1: none)
        self.start = 0  # where the JSON value starts
        self.end = 0  # where it ends
        self.json = JsonPrefix()

    def feed(self, text: str) -> bool:
        begin, self.text = len(self.text), self.text + text
        return all(self._char(pos) for pos in range(begin, len(self.text)))

    def _char(self, pos: int) -> bool:
        ch, stage = self.text[pos], self.stage
        if stage in ("lead", "inner"):
            if ch.isspace():
                return True
            if ch == "`" and stage == "lead":
                self.stage, self.fence = "fence", pos
                return True
            if ch not in "{[":
                return False
            self.stage, self.start = "json", pos
            return self.json.feed(ch)
        if stage == "fence":
            line = self.text[self.fence : pos + 1]
            if not _FENCE_LINE.fullmatch(line):
                return False
            if ch == "\n":
                self.stage = "inner"
            return True
        if stage == "json":
            if not self.json.feed(ch):
                return False
            if self.json.done:
                self.stage, self.end = "tail", pos + 1
            return True
        # the tail: white space, and the closing fence when there was an opening one
        tail = self.text[self.end : pos + 1].strip()
        return not tail or (self.fence_open and tail in ("`", "``", "```"))

    @property
    def fence_open(self) -> bool:
        return self.text[: self.start].lstrip().startswith("`")

    def calls(self, names: frozenset[str]) -> list[ToolCall]:
        """The calls the whole reply is, each to one of `names` (ValueError: it is not that)."""
        if self.stage != "tail":
            raise ValueError("not one whole JSON value")
        value = loads(self.text[self.start : self.end])
        calls = [as_call(v) for v in (value if isinstance(value, list) else [value])]
        if not calls or any(c.name not in names for c in calls):
            raise ValueError("not a call to one of the request's tools")
        return calls
