"""Tool calls streamed as the model writes them (specfill/serve/tool_stream.py): the header read,
the JSON-prefix check, and StreamingSplitter against the whole-reply splitter (no server)."""

from __future__ import annotations

import json

import pytest

from specfill.serve.tool_parsers import HERMES, LLAMA3, ReplySplitter, Text, ToolCall
from specfill.serve.tool_stream import CallArgs, CallEnd, CallStart, JsonPrefix, StreamingSplitter, call_header

NAMES = frozenset({"get_weather", "get_time"})
ARGS = '{"city": "Pa\\"ris \\u00e9", "n": [1, -2.5e3, 0.5, true, false, null], "o": {}, "l": []}'
TWO = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + "}\n</tool_call>\n"
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


def stream(text: str, size: int, fmt=HERMES, **options) -> list:
    splitter, pieces = StreamingSplitter(fmt, names=NAMES, **options), []
    for i in range(0, len(text), size):
        pieces += splitter.feed(text[i : i + size])
    return pieces + splitter.finish()


def fold(pieces: list) -> list:
    """Streamed pieces as a whole reply reads: each streamed call its CallEnd's call (or
    ("broken", the arguments it streamed)), neighbouring text joined."""
    out: list = []
    args = None
    for piece in pieces:
        if isinstance(piece, CallStart):
            args = ""
        elif isinstance(piece, CallArgs):
            args += piece.text
        elif isinstance(piece, CallEnd):
            out.append(piece.call if piece.call is not None else ("broken", args))
        elif isinstance(piece, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


@pytest.mark.parametrize("size", [1, 2, 5, 17, 1000])
def test_streamed_calls_equal_whole_ones(size):
    pieces = stream(TWO, size)
    assert fold(pieces) == [Text("Checking."), ToolCall("get_weather", json.loads(ARGS)), ToolCall("get_time", {})]
    assert [p.name for p in pieces if isinstance(p, CallStart)] == ["get_weather", "get_time"]
    if size < len(ARGS):  # the arguments came in more than one piece, each as the model wrote it
        first = pieces[pieces.index(CallStart("get_weather")) + 1 : pieces.index(CallEnd(fold(pieces)[1]))]
        assert len(first) > 1 and "".join(p.text for p in first) == ARGS


def test_every_streamed_prefix_parses_partially():
    """What Anthropic's client does after each input_json_delta: a partial parse of all so far."""
    jiter = pytest.importorskip("jiter")
    so_far = ""
    for piece in stream(TWO, 1):
        if isinstance(piece, CallStart):
            so_far = ""
        elif isinstance(piece, CallArgs):
            so_far += piece.text
            jiter.from_json(so_far.encode(), partial_mode=True)


def test_broken_arguments_end_the_call_and_become_content():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call> ok'
    for size in (1, 4, 1000):
        assert fold(stream(bad, size)) == [("broken", '{"city": '), Text("Paris}}\n</tool_call> ok")]
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'  # the reply ended: the call keeps it
    assert fold(stream(cut, 3)) == [("broken", '{"city": "Par')]
    leading_zero = '<tool_call>\n{"name": "get_time", "arguments": {"a": 01}}\n</tool_call>'
    assert fold(stream(leading_zero, 1))[0] == ("broken", '{"a": 0')


def test_calls_without_a_header_are_read_whole():
    cases = {  # another key order, arguments as a string, a name not among the tools, a list of calls
        '<tool_call>\n{"arguments": {}, "name": "get_time"}\n</tool_call>': [ToolCall("get_time", {})],
        '<tool_call>\n{"name": "get_time", "arguments": "{}"}\n</tool_call>': [ToolCall("get_time", {})],
        '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>': [ToolCall("rm", {})],
        '<tool_call>\n[{"name": "get_time", "arguments": {}}]\n</tool_call>': [ToolCall("get_time", {})],
        "<tool_call>\nnot json\n</tool_call>": [Text("<tool_call>\nnot json\n</tool_call>")],
    }
    for text, whole in cases.items():
        for size in (1, 3, 1000):
            pieces = stream(text, size)
            assert not any(isinstance(p, CallStart) for p in pieces) and fold(pieces) == whole, (text, size)
    llama = '{"name": "get_time", "parameters": {}}'  # other formats: whole calls, as ReplySplitter reads them
    whole_splitter = ReplySplitter(LLAMA3)
    assert (
        stream(llama, 2, LLAMA3) == whole_splitter.feed(llama) + whole_splitter.finish() == [ToolCall("get_time", {})]
    )


def test_forced_start_extra_keys_and_the_call_cap():
    forced = HERMES.forced("get_time") + '{"tz": "UTC"}, "id": 3}\n</tool_call>'  # other keys after the arguments
    assert fold(stream(forced, 2)) == [ToolCall("get_time", {"tz": "UTC"})]
    after = HERMES.forced("get_time") + '{"tz": "UTC"}} and more\n</tool_call>'
    assert fold(stream(after, 2)) == [ToolCall("get_time", {"tz": "UTC"}), Text("} and more")]
    capped = stream(TWO, 3, max_calls=1)  # parallel_tool_calls false: the second call is neither streamed nor kept
    assert fold(capped) == [Text("Checking."), ToolCall("get_weather", json.loads(ARGS))]


def test_call_header():
    head = '\n{ "name" : "get_time",\n "arguments": {"tz"'
    assert call_header(head, NAMES) == ("get_time", head.index("{", 3))
    assert call_header('{"name": "get_ti', NAMES) is None and call_header('{"na', NAMES) is None
    assert call_header('{"name": "get_time", "argu', NAMES) is None
    assert call_header('{"name": " get_time"', NAMES) is False  # the name as written, space included
    assert call_header('{"name": "rm", "arguments": {', NAMES) is False
    assert call_header('{"name": "rm", "arguments": {', None) == ("rm", 28)
    assert call_header('{"arguments": {}', NAMES) is False and call_header("[{", NAMES) is False


def test_json_prefix():
    for text in (ARGS, "[]", '"x"', "-0.5e+3 ", "[true,false,null]", '{"a":{"b":[1,{"c":"\\n"}]}}'):
        check = JsonPrefix()
        assert all(check.feed(ch) for ch in text.rstrip() + (" " if text[-1].isdigit() else "")), text
    for text, at in (('{"a" 1}', 5), ("{a}", 1), ('{"a": tru ', 9), ('{"a": 1,}', 8), ("[1 2]", 3), ('"\\x"', 2)):
        check = JsonPrefix()
        taken = next(i for i, ch in enumerate(text) if not check.feed(ch))
        assert taken == at, (text, taken)
    done = JsonPrefix()
    assert all(done.feed(ch) for ch in "{}") and done.done and not done.feed(" ")
