"""The 2026 models' tool-call formats (issue 46 item 6), read from replies as those models write
them: through mlx-lm's parsers where it has one (qwen3_coder, glm47, kimi_k2, minimax_m2, gemma4,
function_gemma, pythonic for LFM2), specfill's harmony reader for gpt-oss, the chat-template
detection against mlx-lm's own, what happens without mlx-lm, and a reply that is only a JSON call
(no server: pure functions)."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from specfill.serve import tool_mlx
from specfill.serve.chat import chat_setup
from specfill.serve.errors import RequestError
from specfill.serve.protocol import ChatRequest
from specfill.serve.reasoning import Thought
from specfill.serve.tool_parsers import (
    FORMATS,
    HARMONY,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    JsonOnly,
    ReplySplitter,
    Text,
    ToolCall,
    detect_format,
)
from specfill.serve.tool_stream import CallEnd, StreamingSplitter


def function(name: str, **properties: str) -> dict:
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()}}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


TOOLS = [function("get_weather", city="string", postcode="string", days="integer"), function("get_time", tz="string")]
WEATHER = ToolCall("get_weather", {"city": "Paris"})
TIME = ToolCall("get_time", {"tz": "UTC"})
needs_mlx_lm = pytest.mark.skipif(not tool_mlx.mlx_available(), reason="mlx-lm is not installed")


def split(fmt, text: str, size: int, stream: bool = False, **options) -> list:
    """The pieces of `text` fed `size` characters at a time (the format bound to TOOLS), text joined."""
    bound = fmt.bind(TOOLS)
    splitter = StreamingSplitter(bound, names=bound.names, **options) if stream else ReplySplitter(bound, **options)
    pieces = []
    for i in range(0, len(text), size):
        pieces += splitter.feed(text[i : i + size])
    joined: list = []
    for piece in pieces + splitter.finish():
        piece = piece.call if isinstance(piece, CallEnd) else piece
        if isinstance(piece, (Text, Thought)) and joined and type(joined[-1]) is type(piece):
            joined[-1] = type(piece)(joined[-1].text + piece.text)
        elif isinstance(piece, (Text, Thought, ToolCall)):
            joined.append(piece)
    return joined


def same_every_split(fmt, text: str) -> list:
    """The pieces, checked equal for every way the reply may arrive (whole and streamed)."""
    pieces = split(fmt, text, len(text))
    for size in (1, 2, 7):
        assert split(fmt, text, size) == pieces, size
        assert split(fmt, text, size, stream=True) == pieces, size
    return pieces


MLX_CASES = [  # (format, reply as the model writes it, pieces)
    (
        "qwen3_coder",  # Qwen3.5 / Qwen3.6 / Qwen3-Coder: values typed by the tool's schema
        "I'll look that up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=postcode>\n75001\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>",
        [
            Text("I'll look that up."),
            ToolCall("get_weather", {"city": "Paris", "postcode": "75001", "days": 3}),
            TIME,
        ],
    ),
    (
        "glm47",  # GLM 4.7 (no new lines) and GLM 4.5 / 4.6 (new lines)
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>3</arg_value></tool_call><tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>UTC</arg_value>\n"
        "</tool_call>",
        [ToolCall("get_weather", {"city": "Paris", "days": 3}), TIME],
    ),
    (
        "kimi_k2",
        "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
        '<|tool_call_argument_begin|>{"tz": "UTC"}<|tool_call_end|><|tool_calls_section_end|>',
        [Text("Checking both."), WEATHER, TIME],
    ),
    (
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="tz">UTC'
        "</parameter>\n</invoke>\n</minimax:tool_call>",
        [ToolCall("get_weather", {"city": "Paris", "days": 3}), TIME],
    ),
    (
        "gemma4",
        '<|tool_call>call:get_weather{city:<|"|>Paris, {France}<|"|>,days:3}<tool_call|>',
        [ToolCall("get_weather", {"city": "Paris, {France}", "days": 3})],
    ),
    (
        "function_gemma",
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
        [WEATHER],
    ),
    (
        "pythonic",  # LFM2
        '<|tool_call_start|>[get_weather(city="Paris", days=3), get_time(tz="UTC")]<|tool_call_end|>Checking.',
        [ToolCall("get_weather", {"city": "Paris", "days": 3}), TIME, Text("Checking.")],
    ),
    (
        "kimi_k2",  # a call to no declared tool is no call: the text as written
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.rm_rf:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        [
            Text(
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.rm_rf:0<|tool_call_argument_begin|>{}"
                "<|tool_call_end|><|tool_calls_section_end|>"
            )
        ],
    ),
    ("gemma4", "<|tool_call>call:get_weather{city:<|", [Text("<|tool_call>call:get_weather{city:<|")]),  # cut short
]


@needs_mlx_lm
@pytest.mark.parametrize("name, output, pieces", MLX_CASES)
def test_mlx_lm_formats(name, output, pieces):
    fmt = FORMATS[name]
    assert fmt.reader == "mlx-lm" or name == "qwen3_coder"
    assert same_every_split(fmt, output) == pieces


@needs_mlx_lm
def test_markers_are_mlx_lms():
    """The markers specfill splits replies at are the ones mlx-lm's parsers name."""
    for fmt in FORMATS.values():
        if fmt.reader == "mlx-lm" or fmt is QWEN3_CODER:
            assert tool_mlx.markers(fmt.name) == (fmt.start, fmt.end), fmt.name


HARMONY_CASES = [
    (  # reasoning, then a call (<|call|> ends generation: it may come as text or not at all)
        "<|channel|>analysis<|message|>The user wants the weather in Paris.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        [Thought("The user wants the weather in Paris."), WEATHER],
    ),
    (
        "<|channel|>analysis<|message|>Need both.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Checking both.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json'
        '<|message|>{"tz": "UTC"}',
        [Thought("Need both."), Text("Checking both."), WEATHER, TIME],
    ),
    (
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is 4 < 5.",
        [Thought("Simple."), Text("It is 4 < 5.")],
    ),
    (  # a call whose arguments are not JSON: its message as written
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": Paris}<|call|>',
        [Text('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": Paris}')],
    ),
    ("Paris is sunny.", [Text("Paris is sunny.")]),  # no harmony at all: content as written
    ("<|channel|>analysis<|message|>Thinking about it", [Thought("Thinking about it")]),  # cut short in its reasoning
]


@pytest.mark.parametrize("output, pieces", HARMONY_CASES)
def test_harmony(output, pieces):
    assert same_every_split(HARMONY, output) == pieces
    if output.endswith("<|call|>"):  # the end token kept out of the text by the detokenizer
        assert same_every_split(HARMONY, output.removesuffix("<|call|>")) == pieces


def test_harmony_cap_and_forced_starts():
    assert split(HARMONY, HARMONY_CASES[1][0], 3, max_calls=1) == [
        Thought("Need both."),
        Text("Checking both."),
        WEATHER,
    ]
    assert split(HARMONY, HARMONY.forced("get_time") + '{"tz": "UTC"}', 4) == [TIME]
    assert split(HARMONY, HARMONY.forced(None) + 'get_time <|constrain|>json<|message|>{"tz": "UTC"}', 4) == [TIME]
    rest = "<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>"
    assert QWEN3_CODER.forced("get_time") == "<tool_call>\n<function=get_time>\n"
    assert split(QWEN3_CODER, QWEN3_CODER.forced("get_time") + rest, 3) == [TIME]
    assert split(QWEN3_CODER, QWEN3_CODER.forced(None) + "get_time>\n" + rest, 3) == [TIME]


@needs_mlx_lm
def test_forced_starts_of_mlx_lm_formats():
    continuations = {
        "glm47": "<arg_key>tz</arg_key><arg_value>UTC</arg_value></tool_call>",
        "kimi_k2": '{"tz": "UTC"}<|tool_call_end|><|tool_calls_section_end|>',
        "minimax_m2": '<parameter name="tz">UTC</parameter>\n</invoke>\n</minimax:tool_call>',
        "gemma4": '{tz:<|"|>UTC<|"|>}<tool_call|>',
        "pythonic": 'tz="UTC")]<|tool_call_end|>',
    }
    for name, rest in continuations.items():
        fmt = FORMATS[name]
        assert split(fmt, fmt.forced("get_time") + rest, 3) == [TIME], name


TEMPLATES = {  # what each family's template says about calls -> the format
    "qwen3_coder": "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}<parameter=",
    "glm47": "<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value></tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|>{% for tc in calls %}<|tool_call_begin|>{{ tc.id }}",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="{{ name }}">',
    "gemma4": "<|tool_call>call:{{ name }}{...}<tool_call|>",
    "function_gemma": "<start_function_call>call:{{ name }}",
    "pythonic": "List of tools: <|tool_list_start|>[{{ tools | tojson }}]<|tool_list_end|>",
    "mistral": "[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]",
    "harmony": "<|start|>assistant<|channel|>commentary to=functions.{{ name }}<|message|>",
    "hermes": '<tool_call>\n{"name": {{ tool_call.name }}, "arguments": ...}\n</tool_call>',
    "llama3": "<|start_header_id|>ipython<|end_header_id|>{{ 'parameters' }}<|python_tag|>",
}


def test_detect_format():
    for name, template in TEMPLATES.items():
        assert detect_format(template) is FORMATS[name], name
    assert detect_format("{{ tools }} <function_call>") is None and detect_format(None) is None


@needs_mlx_lm
def test_detection_agrees_with_mlx_lm():
    """mlx-lm's choice from the same template text (its tokenizer_utils._infer_tool_parser), where it
    has a parser of its own for the format."""
    infer = pytest.importorskip("mlx_lm.tokenizer_utils")._infer_tool_parser
    for name, template in TEMPLATES.items():
        theirs = infer(types.SimpleNamespace(chat_template=template, get_vocab=lambda: {}))
        if name in ("harmony", "llama3"):
            assert theirs is None, name
        elif name == "hermes":
            assert theirs == "json_tools"
        else:
            assert theirs == name, name


def test_without_mlx_lm(monkeypatch):
    """mlx-lm not installed: qwen3_coder is read by specfill's own reader (values as JSON, not by
    schema), harmony and the Hermes / Llama / Mistral formats as always, and a template whose format
    only mlx-lm reads is a 400 that says so."""
    tool_mlx.mlx_parser.cache_clear()
    monkeypatch.setattr(tool_mlx, "_package", lambda: None)
    try:
        call = (
            "<tool_call>\n<function=get_weather>\n<parameter=postcode>\n75001\n</parameter>\n</function>\n</tool_call>"
        )
        assert same_every_split(QWEN3_CODER, call) == [ToolCall("get_weather", {"postcode": 75001})]
        assert same_every_split(HARMONY, HARMONY_CASES[0][0]) == HARMONY_CASES[0][1]
        assert FORMATS["glm47"].missing() == "mlx-lm is not installed (pip install mlx-lm)"
        assert QWEN3_CODER.missing() is None and HERMES.missing() is None
        request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "tools": TOOLS})
        with pytest.raises(RequestError) as refused:
            chat_setup(request, "{{ tools }}" + TEMPLATES["glm47"])
        assert refused.value.param == "tools"
        assert refused.value.message == (
            "'tools': the model writes tool calls in the glm47 format, read with mlx-lm: "
            "mlx-lm is not installed (pip install mlx-lm)"
        )
        assert chat_setup(request, "{{ tools }}" + TEMPLATES["qwen3_coder"]).format.name == "qwen3_coder"
    finally:
        tool_mlx.mlx_parser.cache_clear()


@needs_mlx_lm
def test_mlx_lm_parsers_load_without_mlx():
    """Reading a call with mlx-lm's parser imports neither MLX nor the mlx_lm package (its
    __init__ imports MLX and transformers: seconds, and useless on the CUDA backend)."""
    code = (
        "import sys\n"
        "from specfill.serve.tool_parsers import FORMATS\n"
        "glm = FORMATS['glm47'].bind([])\n"
        "assert glm.calls('get_time<arg_key>tz</arg_key><arg_value>UTC</arg_value>')[0].name == 'get_time'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'transformers')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


JSON_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
JSON_ONLY_CASES = [  # what small models write where their template asks for tags
    ("```json\n" + JSON_CALL + "\n```", [WEATHER]),
    ("  " + JSON_CALL + "\n", [WEATHER]),
    (
        '```\n[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "arguments": '
        '"{\\"tz\\": \\"UTC\\"}"}]\n```\n',
        [WEATHER, TIME],
    ),
    ("```json\n" + JSON_CALL, [WEATHER]),  # the closing fence never came
    ("Here is the call:\n```json\n" + JSON_CALL + "\n```", None),  # JSON among prose stays text
    (JSON_CALL + " I will now wait for the result.", None),
    ("```json\n" + JSON_CALL + "\n```\nThen I will answer.", None),
    ('{"name": "rm_rf", "arguments": {}}', None),  # not a declared tool
    ('{"temperature": 21, "unit": "C"}', None),  # JSON, but no call
    ("```python\nprint('hi')\n```", None),
    ("{not json", None),
]


@pytest.mark.parametrize("output, pieces", JSON_ONLY_CASES)
def test_a_reply_that_is_only_a_json_call(output, pieces):
    for fmt in (HERMES, QWEN3_CODER, MISTRAL, HARMONY):
        assert same_every_split(fmt, output) == (pieces or [Text(output)]), fmt.name
    assert split(LLAMA3, output, 3) == (pieces or split(LLAMA3.bind(()), output, 3))  # Llama's own rules otherwise
    unbound = ReplySplitter(HERMES)  # a format without the request's tools: no fallback, the text as written
    assert "".join(p.text for p in unbound.feed(output) + unbound.finish()) == output


def test_json_only_gives_up_early():
    """A stream is held back only while the reply can still be a JSON call."""
    watch = JsonOnly()
    assert watch.feed("```js") and watch.feed("on\n{") and watch.feed('"name": "get_weather", "arguments": {}}')
    assert watch.feed("\n``") and watch.feed("`\n") and not watch.feed("More")
    assert not JsonOnly().feed("Sure: {")
    bound = HERMES.bind(TOOLS)
    splitter = ReplySplitter(bound)
    assert splitter.feed("{") == [] and splitter.feed('"a": 1}') == [] and splitter.feed(" and") != []
    assert json.loads(JSON_CALL)["name"] in bound.names


def test_server_says_at_start_when_mlx_lm_is_missing(monkeypatch, caplog):
    """A served model whose format only mlx-lm reads, without mlx-lm: one warning line at start."""
    from specfill.serve import ServerDefaults
    from specfill.serve.app import create_app

    engine = types.SimpleNamespace(tokenizer=types.SimpleNamespace(chat_template="{{ tools }}" + TEMPLATES["gemma4"]))
    tool_mlx.mlx_parser.cache_clear()
    monkeypatch.setattr(tool_mlx, "_package", lambda: None)
    try:
        with caplog.at_level("WARNING", logger="specfill.serve"):
            try:
                create_app(engine, ServerDefaults("m"))
            except AttributeError:
                pass  # the stand-in engine has no model: the routes need one, the warning came first
    finally:
        tool_mlx.mlx_parser.cache_clear()
    assert [r.getMessage() for r in caplog.records] == [
        "tool calls: the model writes the gemma4 format, read with mlx-lm: mlx-lm is not installed (pip install mlx-lm)"
    ]
