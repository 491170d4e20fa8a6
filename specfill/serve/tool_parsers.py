"""Tool calls in a model's reply: the formats of the families specfill serves, read back from text.

The server's detokenizer keeps every format's markers (ToolFormat.texts; reply_text.py leaves the
other control tokens out), so they arrive as text: Qwen's `<tool_call>` tags, Llama's
`<|python_tag|>`, Mistral's `[TOOL_CALLS]`, gpt-oss's `<|channel|>`. detect_format picks a format from the chat
template's source (the markers it teaches, in the order mlx-lm's tokenizer_utils checks them), and
chat.py binds it to the request's tools (ToolFormat.bind). Who reads each format's calls:

  mlx-lm (tool_mlx.py; a 400 naming the format when mlx-lm is not installed):
    qwen3_coder  <tool_call><function=NAME><parameter=P>v</parameter></function></tool_call>
                 (Qwen3.5, Qwen3.6, Qwen3-Coder; values typed by the tool's schema). Without mlx-lm,
                 or when mlx-lm's parser reads nothing (a JSON body), specfill's own hermes reader
    glm47        <tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call> (GLM 4.5-4.7)
    kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}...
    minimax_m2   <minimax:tool_call><invoke name="NAME"><parameter name="P">v</parameter></invoke>...
    gemma4       <|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>
    function_gemma, pythonic (LFM2: <|tool_call_start|>[NAME(k="v")]<|tool_call_end|>), longcat,
    minicpm5, muse_spark
  specfill (this module; mlx-lm has none, or specfill's reads more):
    hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Qwen2.5,
             Qwen3, Hermes); several calls in one block, arguments as a JSON string; the arguments
             stream as written (tool_stream.py). mlx-lm's json_tools is one json.loads of the body
    llama3   the reply itself is the call: {"name": ..., "parameters": {...}}, maybe after
             <|python_tag|>, several separated by ';' or new lines (Llama 3.1 / 3.2 / 3.3 JSON tools)
    mistral  [TOOL_CALLS] then [{"name": ..., "arguments": {...}}, ...] (v3) or NAME[ARGS]{...} (v11+,
             with [CALL_ID], which mlx-lm's mistral parser reads as the name)
    harmony  gpt-oss's channels (tool_harmony.py)

ReplySplitter turns the reply's text, as it streams, into content text and whole calls. A call
that does not parse is handed back as the text the model wrote (content), never as an error. A
reply that is nothing but a JSON call to one of the request's tools, fenced (```json) or bare, is
that call whatever the format (small models write one where their template asks for tags); JSON
among other text stays text. A stream reads Hermes calls with tool_stream.StreamingSplitter
instead, which hands a call out as the model writes it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .tool_calls import MODEL_JSON, JsonOnly, Piece, Text, ToolCall, as_call, held, json_calls, loads
from .tool_harmony import HarmonyReader
from .tool_mlx import MissingParser, mlx_available, mlx_parser, mlx_read

Tools = Sequence[dict[str, Any]]  # OpenAI function tools: {"type": "function", "function": {...}}

# a <function=...> block ends at the first </function> outside its parameters' values: a string value
# is any text up to its </parameter> (reply_grammar.py's RawText), so it may hold "</function>" itself
XML_VALUE = ("<parameter=", "</parameter>")  # what opens and closes a parameter of an XML call
_FUNCTION = re.compile(r"<function=([^>\s]+)>((?:<parameter=[^>\s]+>.*?</parameter>|.)*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def _xml_value(raw: str) -> Any:
    """A Qwen3-Coder parameter value: JSON when it parses (numbers, objects), else the text."""
    text = raw.removeprefix("\n").removesuffix("\n")
    try:
        return loads(text)
    except ValueError:  # json.JSONDecodeError included
        return text


def hermes_calls(body: str, tools: Tools = ()) -> list[ToolCall]:
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


def qwen3_coder_calls(body: str, tools: Tools = ()) -> list[ToolCall]:
    """A <tool_call> block of Qwen3.5 / Qwen3-Coder: mlx-lm's qwen3_coder parser for each
    <function=...> in it (it reads one, typed by the tool's schema), else specfill's hermes reader
    (mlx-lm not installed, or a JSON body)."""
    functions = [m.group(0) for m in _FUNCTION.finditer(body)]
    if functions and not _FUNCTION.sub("", body).strip() and mlx_available():
        try:
            return [call for text in functions for call in mlx_read("qwen3_coder", text, tools)]
        except (ValueError, MissingParser):
            pass
    return hermes_calls(body)


_MISTRAL_HEADER = re.compile(r"\s*([\w.-]+)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]\s*")


def mistral_calls(body: str, tools: Tools = ()) -> list[ToolCall]:
    """What follows [TOOL_CALLS]: a JSON list of calls (v3 tokenizers), or NAME[ARGS]{...} calls,
    each after its own [TOOL_CALLS] (v11+)."""
    calls: list[ToolCall] = []
    decoder = MODEL_JSON
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
            calls.append(as_call({"name": header.group(1), "arguments": arguments}))
    return calls


def llama3_calls(body: str, tools: Tools = ()) -> list[ToolCall]:
    return json_calls(body)


def harmony_calls(body: str, tools: Tools = ()) -> list[ToolCall]:
    """Not used: a harmony reply is read message by message (tool_harmony.HarmonyReader)."""
    raise ValueError("harmony replies are read by tool_harmony.HarmonyReader")


def _mlx(name: str) -> Callable[[str, Tools], list[ToolCall]]:
    def parse(body: str, tools: Tools = ()) -> list[ToolCall]:
        try:
            return mlx_read(name, body, tools)
        except MissingParser as err:
            raise ValueError(str(err)) from None

    parse.__name__ = f"mlx_lm_{name}_calls"
    return parse


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes calls. start: the marker that opens a call anywhere in the reply; end:
    the one that closes it (None: the call runs to the end of the reply); leading: openings that
    make the whole reply a call when it starts with them (Llama's bare JSON); reader: who reads the
    calls ("specfill", or "mlx-lm": needs mlx-lm installed); streamed: a call whose body begins with
    a JSON header streams its arguments (tool_stream.py); messages: the reply is harmony messages
    (tool_harmony.py), not text with calls between markers; tools: the request's tools (bind); call:
    (what follows `required` before a named call's arguments, what follows them) where a
    constrained reply can be written (chat.reply_grammar); arguments: how the call writes them,
    "json" or "xml" (Qwen3-Coder's <parameter=...> blocks: reply_grammar.py); markers: what the
    reader reads inside a call besides the texts above (Gemma 4's <|"|> quotes, Mistral's [ARGS]),
    kept in the reply's text where they are control tokens (reply_text.py)."""

    name: str
    start: str
    end: str | None
    parse: Callable[[str, Tools], list[ToolCall]]  # the text between the markers, tools -> calls (ValueError: none)
    required: str  # the reply's forced start for tool_choice "required"
    named: str  # ... for a named function ({name}: the name as a JSON string; {bare}: as it is)
    leading: tuple[str, ...] = ()
    reader: str = "specfill"
    streamed: bool = False
    messages: bool = False
    tools: tuple[dict[str, Any], ...] = ()
    call: tuple[str, str] | None = None
    arguments: str = "json"
    markers: tuple[str, ...] = ()

    def forced(self, name: str | None) -> str:
        """The text a reply is started with so that it is a call (to `name`, when given)."""
        return self.required if name is None else self.named.format(name=json.dumps(name), bare=name)

    def bind(self, tools: Tools) -> ToolFormat:
        """This format for one request: its parsers see the tools (types by schema) and only a call
        to one of them counts as a JSON-only reply."""
        return dataclasses.replace(self, tools=tuple(tools))

    @property
    def texts(self) -> tuple[str, ...]:
        """Every text the reader reads: a control token found in one stays in the reply's text."""
        texts = (self.start, self.end, *self.leading, self.required, self.named, *(self.call or ()), *self.markers)
        return tuple(t for t in texts if t)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)

    def end_at(self, body: str) -> int:
        """Where `end` closes a call whose body (so far) is `body`; -1: not yet. Its first occurrence,
        but outside the parameters' values of a call that writes XML arguments: a string value is any
        text up to its </parameter> (reply_grammar.py), so it may hold the closing marker itself."""
        assert self.end is not None
        at = 0
        while True:
            cut = body.find(self.end, at)
            value = body.find(XML_VALUE[0], at) if self.arguments == "xml" else -1
            if cut < 0 or value < 0 or cut < value:
                return cut
            closed = body.find(XML_VALUE[1], value)
            if closed < 0:  # inside a value: the call goes on
                return -1
            at = closed + len(XML_VALUE[1])

    def calls(self, body: str) -> list[ToolCall]:
        """The calls in the text between a call's markers (ValueError: none)."""
        return self.parse(body, self.tools)

    def missing(self) -> str | None:
        """Why this format cannot be read here (mlx-lm missing, or too old), else None."""
        if self.reader != "mlx-lm":
            return None
        try:
            mlx_parser(self.name)
        except MissingParser as err:
            return str(err)
        return None


HERMES = ToolFormat(
    "hermes",
    "<tool_call>",
    "</tool_call>",
    hermes_calls,
    required="<tool_call>",
    named='<tool_call>\n{{"name": {name}, "arguments": ',
    streamed=True,
    call=('\n{{"name": {name}, "arguments": ', "}\n</tool_call>"),
)
LLAMA3 = ToolFormat(
    "llama3",
    "<|python_tag|>",
    None,
    llama3_calls,
    required='{"name": "',
    named='{{"name": {name}, "parameters": ',
    leading=("{",),
    call=('{bare}", "parameters": ', "}"),
)
MISTRAL = ToolFormat(
    "mistral",
    "[TOOL_CALLS]",
    None,
    mistral_calls,
    required="[TOOL_CALLS]",
    named="[TOOL_CALLS]",
    markers=("[CALL_ID]", "[ARGS]"),
)
QWEN3_CODER = ToolFormat(
    "qwen3_coder",
    "<tool_call>",
    "</tool_call>",
    qwen3_coder_calls,
    required="<tool_call>\n<function=",
    named="<tool_call>\n<function={bare}>\n",
    call=("{bare}>\n", "</function>\n</tool_call>"),
    arguments="xml",
)
HARMONY = ToolFormat(
    "harmony",
    "<|channel|>",
    None,
    harmony_calls,
    required="<|channel|>commentary to=functions.",
    named="<|channel|>commentary to=functions.{bare} <|constrain|>json<|message|>",
    messages=True,
    call=("{bare} <|constrain|>json<|message|>", ""),
)


def _mlx_format(name: str, start: str, end: str | None, named: str = "", markers: tuple[str, ...] = ()) -> ToolFormat:
    return ToolFormat(
        name, start, end, _mlx(name), required=start, named=start + named, reader="mlx-lm", markers=markers
    )


_ARGUMENT_TAGS = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
GLM47 = _mlx_format("glm47", "<tool_call>", "</tool_call>", "{bare}", _ARGUMENT_TAGS)
_KIMI_CALL = "<|tool_call_begin|>functions.{bare}:0<|tool_call_argument_begin|>"
KIMI_K2 = dataclasses.replace(
    _mlx_format("kimi_k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", _KIMI_CALL),
    call=(_KIMI_CALL, "<|tool_call_end|><|tool_calls_section_end|>"),
)
MINIMAX_M2 = _mlx_format("minimax_m2", "<minimax:tool_call>", "</minimax:tool_call>", '\n<invoke name="{bare}">\n')
GEMMA4 = _mlx_format("gemma4", "<|tool_call>", "<tool_call|>", "call:{bare}", ('<|"|>',))
FUNCTION_GEMMA = _mlx_format(
    "function_gemma", "<start_function_call>", "<end_function_call>", "call:{bare}", ("<escape>",)
)
PYTHONIC = dataclasses.replace(
    _mlx_format("pythonic", "<|tool_call_start|>", "<|tool_call_end|>", "[{bare}("), required="<|tool_call_start|>["
)
LONGCAT = _mlx_format(
    "longcat",
    "<longcat_tool_call>",
    "</longcat_tool_call>",
    "{bare}",
    tuple(t.replace("arg_", "longcat_arg_") for t in _ARGUMENT_TAGS),
)
MINICPM5 = dataclasses.replace(
    _mlx_format("minicpm5", "<function name=", "</function>", '"{bare}">'), required="<function name="
)
MUSE_SPARK = _mlx_format("muse_spark", "<atem:function_calls>", "</atem:function_calls>")

FORMATS = {
    f.name: f
    for f in (
        HERMES,
        LLAMA3,
        MISTRAL,
        QWEN3_CODER,
        HARMONY,
        GLM47,
        KIMI_K2,
        MINIMAX_M2,
        GEMMA4,
        FUNCTION_GEMMA,
        PYTHONIC,
        LONGCAT,
        MINICPM5,
        MUSE_SPARK,
    )
}


def _escaped(template: str, text: str) -> bool:
    """Whether the template has `text`, with its new lines as they are or written as \\n."""
    return text in template or text.replace("\n", "\\n") in template


# The chat template's markers -> the format, first match wins (mlx-lm's order: a template with
# <arg_key> is GLM's although it also has <tool_call>, Qwen3-Coder's is checked before Hermes').
_DETECT: tuple[tuple[Callable[[str], bool], ToolFormat], ...] = (
    (lambda t: "<minimax:tool_call>" in t, MINIMAX_M2),
    (lambda t: "<|tool_call>" in t and "<tool_call|>" in t, GEMMA4),
    (lambda t: "<start_function_call>" in t, FUNCTION_GEMMA),
    (lambda t: "<longcat_tool_call>" in t, LONGCAT),
    (lambda t: "<arg_key>" in t, GLM47),
    (lambda t: "<|tool_list_start|>" in t or "<|tool_call_start|>" in t, PYTHONIC),
    (lambda t: _escaped(t, "<tool_call>\n<function=") or ("<tool_call>" in t and "<parameter=" in t), QWEN3_CODER),
    (lambda t: "<|tool_calls_section_begin|>" in t, KIMI_K2),
    (lambda t: '<function name="' in t and '<param name="' in t, MINICPM5),
    (lambda t: "[TOOL_CALLS]" in t, MISTRAL),
    (lambda t: "<atem:function_calls>" in t, MUSE_SPARK),
    (lambda t: "<|channel|>" in t and "<|message|>" in t, HARMONY),
    (lambda t: "<tool_call>" in t, HERMES),
    (lambda t: "<|python_tag|>" in t or ("<|start_header_id|>" in t and "parameters" in t), LLAMA3),
)


def detect_format(template: str | None) -> ToolFormat | None:
    """The call format a chat template teaches its model (None: none specfill reads)."""
    if not template:
        return None
    return next((fmt for test, fmt in _DETECT if test(template)), None)


class ReplySplitter:
    """Content text and whole tool calls from a reply streamed in pieces.

    Text that may be the start of a marker is held back until it is known not to be; white space
    is held until text follows it (white space next to a call is dropped). Inside a call the text is
    kept until the call closes (or the reply ends), then parsed; a call that does not parse comes
    back as the text it was. A reply that starts like a JSON call (a fence, '{' or '[') is held
    until it is known to be more than one (JsonOnly), when the format has tools. A harmony reply is
    read by tool_harmony.HarmonyReader. max_calls: calls beyond it are dropped
    (parallel_tool_calls false). fmt None: every piece is content, as given.
    """

    def __init__(self, fmt: ToolFormat | None, max_calls: int | None = None):
        self.fmt = fmt
        self.max_calls = max_calls
        self.pending = ""  # text not yet handed out
        self.body: str | None = None  # inside a call: its text so far (after `opening`)
        self.opening = ""  # the marker that opened the current call (and the white space before it)
        self.calls = 0  # calls handed out
        self.began = False  # text other than white space has been seen (leading openings no longer apply)
        self.json_only = JsonOnly() if fmt is not None and fmt.tools else None  # None: decided (or no tools)
        self.harmony = HarmonyReader() if fmt is not None and fmt.messages else None

    def feed(self, text: str) -> list[Piece]:
        if self.fmt is None:
            return [Text(text)] if text else []
        if self.json_only is not None:
            if self.json_only.feed(text):
                return []
            text, self.json_only = self.json_only.text, None
        if self.harmony is not None:
            return self._cap(self.harmony.feed(text))
        self.pending += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        """Whatever is held back, once the reply has ended (an unclosed call is parsed as it is)."""
        if self.fmt is None:
            return []
        if self.json_only is not None:
            watch, self.json_only = self.json_only, None
            try:
                return self._cap(list(watch.calls(self.fmt.names)))
            except ValueError:
                return self.feed(watch.text) + self._end()
        return self._end()

    def _end(self) -> list[Piece]:
        """finish(), once a held JSON-only reply is known to be none."""
        if self.harmony is not None:
            return self._cap(self.harmony.finish())
        out: list[Piece] = []
        if self.body is not None:
            out.extend(self._close(self.body + self.pending, self.opening + self.body + self.pending))
        elif self.pending.strip() or (self.pending and not self.calls):
            out.append(Text(self.pending.strip() if self.calls else self.pending))
        self.pending, self.body = "", None
        return out

    def _cap(self, pieces: list[Piece]) -> list[Piece]:
        """The pieces with calls beyond max_calls left out."""
        out: list[Piece] = []
        for piece in pieces:
            if isinstance(piece, ToolCall):
                if self.max_calls is not None and self.calls >= self.max_calls:
                    continue
                self.calls += 1
            out.append(piece)
        return out

    def _step(self, out: list[Piece]) -> bool:
        """Hand out what can be; True when there is more to look at."""
        fmt = self.fmt
        assert fmt is not None
        if self.body is not None:  # inside a call
            self.body, self.pending = self.body + self.pending, ""
            if fmt.end is None or (cut := fmt.end_at(self.body)) < 0:
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
        hold = held(self.pending, fmt.start)
        ready = self.pending[: len(self.pending) - hold].rstrip()  # trailing white space waits: a call may follow
        if ready.strip():
            out.append(Text(ready))
            self.pending = self.pending[len(ready) :]
            self.began = True
        return False

    def _close(self, body: str, raw: str) -> list[Piece]:
        """A finished call's pieces: its calls, or its text when it does not parse."""
        try:
            calls = self.fmt.calls(body) if self.fmt is not None else []
        except ValueError:  # json.JSONDecodeError included
            calls = []
        if not calls:
            return [Text(raw)] if raw.strip() else []
        room = len(calls) if self.max_calls is None else max(0, self.max_calls - self.calls)
        self.calls += min(room, len(calls))
        return list(calls[:room])


__all__ = [
    "FORMATS",
    "HARMONY",
    "HERMES",
    "LLAMA3",
    "MISTRAL",
    "QWEN3_CODER",
    "JsonOnly",
    "Piece",
    "ReplySplitter",
    "Text",
    "ToolCall",
    "ToolFormat",
    "detect_format",
    "hermes_calls",
    "json_calls",
    "mistral_calls",
]
