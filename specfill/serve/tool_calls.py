"""What a reply's tool calls are made of, shared by the format readers (tool_parsers.py,
tool_mlx.py, tool_harmony.py) and the streamed reading (tool_stream.py): a call (ToolCall), the
reply's other text (Text), a call object read from JSON (as_call, json_calls), and a check that
text is the start of one JSON value (JsonPrefix).
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Text:
    text: str


Piece = Union[Text, ToolCall]


def as_call(value: Any) -> ToolCall:
    """One {"name", "arguments" | "parameters"} object as a call; ValueError for anything else
    (arguments may come as a JSON string of an object, as some templates render them)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ValueError("not a tool call object")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json.loads(arguments or "{}")
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments are not an object")
    return ToolCall(value["name"], arguments)


def json_calls(text: str) -> list[ToolCall]:
    """Calls from JSON values in a row (objects, or lists of them), separated by white space, ';'
    or ','; ValueError if anything else is there."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
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
