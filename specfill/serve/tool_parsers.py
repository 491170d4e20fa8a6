"""Tool calls in a model's reply: the formats of the families specfill serves, read back from text.

The server's detokenizer keeps added and special tokens, so the markers arrive as text: Qwen's
`<tool_call>` tags (added tokens that `skip_special_tokens` would drop), Llama's `<|python_tag|>`,
Mistral's `[TOOL_CALLS]`. Formats (detect_format picks one from the chat template's source):

  hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Qwen2.5,
           Qwen3, Hermes); the body may be Qwen3-Coder's <function=NAME><parameter=P>v</parameter></function>
  llama3   the reply itself is the call: {"name": ..., "parameters": {...}}, maybe after
           <|python_tag|>, several separated by ';' or new lines (Llama 3.1 / 3.2 / 3.3 JSON tools)
  mistral  [TOOL_CALLS] then [{"name": ..., "arguments": {...}}, ...] (v3) or NAME[ARGS]{...} (v11+)

ReplySplitter turns the reply's text, as it streams, into content text and whole calls. A call
that does not parse is handed back as the text the model wrote (content), never as an error.
A stream reads Hermes calls with tool_stream.StreamingSplitter instead, which hands a call out as
the model writes it.
Written here rather than imported from mlx-lm (docs/serve.md says why).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Union


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Text:
    text: str


Piece = Union[Text, ToolCall]


def _call(value: Any) -> ToolCall:
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
        calls.extend(_call(v) for v in (value if isinstance(value, list) else [value]))


_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def _xml_value(raw: str) -> Any:
    """A Qwen3-Coder parameter value: JSON when it parses (numbers, objects), else the text."""
    text = raw.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def hermes_calls(body: str) -> list[ToolCall]:
    """The body of one <tool_call> block: JSON, or Qwen3-Coder's <function=...> form."""
    if body.lstrip().startswith("<function="):
        calls = [
            ToolCall(name, {p: _xml_value(v) for p, v in _PARAMETER.findall(inner)})
            for name, inner in _FUNCTION.findall(body)
        ]
        if not calls or _FUNCTION.sub("", body).strip():
            raise ValueError("not a <function=...> call")
        return calls
    return json_calls(body)


_MISTRAL_HEADER = re.compile(r"\s*([\w.-]+)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]\s*")


def mistral_calls(body: str) -> list[ToolCall]:
    """What follows [TOOL_CALLS]: a JSON list of calls (v3 tokenizers), or NAME[ARGS]{...} calls,
    each after its own [TOOL_CALLS] (v11+)."""
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    for part in body.split("[TOOL_CALLS]"):
        if not part.strip():
            continue
        if part.lstrip()[:1] in "[{":
            calls.extend(json_calls(part))
            continue
        pos = 0
        while pos < len(part) and part[pos:].strip():
            header = _MISTRAL_HEADER.match(part, pos)
            if header is None:
                raise ValueError("not a NAME[ARGS]{...} call")
            arguments, pos = decoder.raw_decode(part, header.end())
            calls.append(_call({"name": header.group(1), "arguments": arguments}))
    return calls


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes calls. start: the marker that opens a call anywhere in the reply; end:
    the one that closes it (None: the call runs to the end of the reply); leading: openings that
    make the whole reply a call when it starts with them (Llama's bare JSON)."""

    name: str
    start: str
    end: str | None
    parse: Callable[[str], list[ToolCall]]  # the text between the markers -> calls (ValueError: none)
    required: str  # the reply's forced start for tool_choice "required"
    named: str  # ... for a named function ({name} is filled in)
    leading: tuple[str, ...] = ()

    def forced(self, name: str | None) -> str:
        """The text a reply is started with so that it is a call (to `name`, when given)."""
        return self.required if name is None else self.named.format(name=json.dumps(name))


HERMES = ToolFormat(
    "hermes",
    "<tool_call>",
    "</tool_call>",
    hermes_calls,
    required="<tool_call>",
    named='<tool_call>\n{{"name": {name}, "arguments": ',
)
LLAMA3 = ToolFormat(
    "llama3",
    "<|python_tag|>",
    None,
    json_calls,
    required='{"name": "',
    named='{{"name": {name}, "parameters": ',
    leading=("{",),
)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", None, mistral_calls, required="[TOOL_CALLS]", named="[TOOL_CALLS]")
FORMATS = {f.name: f for f in (HERMES, LLAMA3, MISTRAL)}


def detect_format(template: str | None) -> ToolFormat | None:
    """The call format a chat template teaches its model (None: none specfill reads)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "parameters" in template):
        return LLAMA3
    return None


class ReplySplitter:
    """Content text and whole tool calls from a reply streamed in pieces.

    Text that may be the start of a marker is held back until it is known not to be; white space
    is held until text follows it (white space next to a call is dropped). Inside a call the text is
    kept until the call closes (or the reply ends), then parsed; a call that does not parse comes
    back as the text it was. max_calls: calls beyond it are dropped (parallel_tool_calls false).
    fmt None: every piece is content, as given.
    """

    def __init__(self, fmt: ToolFormat | None, max_calls: int | None = None):
        self.fmt = fmt
        self.max_calls = max_calls
        self.pending = ""  # text not yet handed out
        self.body: str | None = None  # inside a call: its text so far (after `opening`)
        self.opening = ""  # the marker that opened the current call (and the white space before it)
        self.calls = 0  # calls handed out
        self.began = False  # text other than white space has been seen (leading openings no longer apply)

    def feed(self, text: str) -> list[Piece]:
        if self.fmt is None:
            return [Text(text)] if text else []
        self.pending += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        """Whatever is held back, once the reply has ended (an unclosed call is parsed as it is)."""
        if self.fmt is None:
            return []
        out: list[Piece] = []
        if self.body is not None:
            out.extend(self._close(self.body + self.pending, self.opening + self.body + self.pending))
        elif self.pending.strip() or (self.pending and not self.calls):
            out.append(Text(self.pending.strip() if self.calls else self.pending))
        self.pending, self.body = "", None
        return out

    def _step(self, out: list[Piece]) -> bool:
        """Hand out what can be; True when there is more to look at."""
        fmt = self.fmt
        assert fmt is not None
        if self.body is not None:  # inside a call
            self.body, self.pending = self.body + self.pending, ""
            if fmt.end is None or (cut := self.body.find(fmt.end)) < 0:
                return False
            body, self.pending = self.body[:cut], self.body[cut + len(fmt.end) :]
            out.extend(self._close(body, self.opening + body + fmt.end))
            self.body = None
            return True
        if not self.began and fmt.leading:
            head = self.pending.lstrip()
            if any(head.startswith(o) for o in fmt.leading):
                self.opening, self.body, self.pending = "", self.pending, ""
                self.began = True
                return True
            if not head or any(o.startswith(head) for o in fmt.leading):
                return False
        at = self.pending.find(fmt.start)
        if at >= 0:
            before = self.pending[:at].rstrip()
            if before:
                out.append(Text(before))
            self.began = True  # the white space before the marker is dropped if a call follows, else kept
            self.opening = self.pending[len(before) : at] + fmt.start
            self.body, self.pending = "", self.pending[at + len(fmt.start) :]
            return True
        hold = max((k for k in range(1, len(fmt.start)) if self.pending.endswith(fmt.start[:k])), default=0)
        ready = self.pending[: len(self.pending) - hold].rstrip()  # trailing white space waits: a call may follow
        if ready.strip():
            out.append(Text(ready))
            self.pending = self.pending[len(ready) :]
            self.began = True
        return False

    def _close(self, body: str, raw: str) -> list[Piece]:
        """A finished call's pieces: its calls, or its text when it does not parse."""
        try:
            calls = self.fmt.parse(body) if self.fmt is not None else []
        except ValueError:  # json.JSONDecodeError included
            calls = []
        if not calls:
            return [Text(raw)] if raw.strip() else []
        room = len(calls) if self.max_calls is None else max(0, self.max_calls - self.calls)
        self.calls += min(room, len(calls))
        return list(calls[:room])
