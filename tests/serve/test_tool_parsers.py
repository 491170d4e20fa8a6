"""The tool-call formats (specfill/serve/tool_parsers.py) read from whole and streamed replies, the
request-side checks of chat.py, and the Anthropic body's translation (no server: pure functions)."""

from __future__ import annotations

import pytest

from specfill.serve.anthropic import MessagesRequest, chat_body
from specfill.serve.chat import chat_setup, output_check, template_messages
from specfill.serve.errors import RequestError
from specfill.serve.protocol import ChatRequest
from specfill.serve.tool_calls import as_call
from specfill.serve.tool_parsers import (
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    ReplySplitter,
    Text,
    ToolCall,
    detect_format,
)

WEATHER = ToolCall("get_weather", {"city": "Paris"})
TIME = ToolCall("get_time", {"tz": "UTC", "n": 2})


def split(fmt, text: str, size: int, **options) -> list:
    """The splitter's pieces for `text` fed `size` characters at a time, neighbouring text joined."""
    splitter, pieces = ReplySplitter(fmt, **options), []
    for i in range(0, len(text), size):
        pieces += splitter.feed(text[i : i + size])
    joined: list = []
    for piece in pieces + splitter.finish():
        if isinstance(piece, Text) and joined and isinstance(joined[-1], Text):
            joined[-1] = Text(joined[-1].text + piece.text)
        else:
            joined.append(piece)
    return joined


CASES = [  # (format, model output, pieces)
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [WEATHER]),
    (
        HERMES,
        'Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\", \\"n\\": 2}"}\n</tool_call>',
        [Text("Checking both."), WEATHER, TIME],
    ),
    (
        HERMES,
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n<parameter=n>\n2\n</parameter>\n"
        "</function>\n</tool_call>",
        [TIME],
    ),  # Qwen3-Coder
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', [WEATHER]),  # EOS before the tag
    (HERMES, "Use <tool_call> tags.", [Text("Use <tool_call> tags.")]),  # not a call: the text as written
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        [Text('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')],
    ),
    (HERMES, "a < b and <tool_c", [Text("a < b and <tool_c")]),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', [WEATHER]),
    (
        LLAMA3,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"tz": "UTC", "n": 2}}',
        [WEATHER, TIME],
    ),
    (LLAMA3, '  \n{"name": "get_weather", "arguments": {"city": "Paris"}}', [WEATHER]),
    (LLAMA3, 'The answer is {"name": 1}.', [Text('The answer is {"name": 1}.')]),
    (LLAMA3, '{"temperature": 21}', [Text('{"temperature": 21}')]),  # JSON, but no call
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"tz": "UTC", "n": 2}}]',
        [WEATHER, TIME],
    ),
    (
        MISTRAL,
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "UTC", "n": 2}',
        [Text("Sure."), WEATHER, TIME],
    ),
    (MISTRAL, '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}', [WEATHER]),
    (MISTRAL, '[TOOL_CALLS]get_weather{"city"', [Text('[TOOL_CALLS]get_weather{"city"')]),
    # numbers no JSON response can carry (json.dumps refuses inf and NaN): not a call, the text as written
    (HERMES, '<tool_call>\n{"name": "f", "arguments": {"x": 1e999}}\n</tool_call>', None),
    (LLAMA3, '{"name": "f", "parameters": {"x": NaN}}', None),
    (
        HERMES,
        "<tool_call>\n<function=f>\n<parameter=x>\n-1e999\n</parameter>\n</function>\n</tool_call>",
        [ToolCall("f", {"x": "-1e999"})],
    ),  # Qwen3-Coder: a parameter that is not a finite JSON value is its text
]


@pytest.mark.parametrize("fmt, output, pieces", CASES)
def test_formats_whole_and_streamed(fmt, output, pieces):
    pieces = [Text(output)] if pieces is None else pieces
    for size in (1, 2, 5, len(output)):  # every split of the markers must give the same pieces
        assert split(fmt, output, size) == pieces, size


def test_a_qwen3_coder_value_may_hold_a_closing_function_tag():
    """A string value is any text up to its </parameter> (what the constrained grammar allows): a value
    "</function>" (a noise model's, under tool_choice required) does not end the call."""
    output = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n</function>\n\n</parameter>\n"
        "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"
    )
    for size in (1, 3, len(output)):
        (call,) = split(QWEN3_CODER, output, size)
        assert call.name == "get_weather" and call.arguments["unit"] == "celsius"
        assert call.arguments["city"].strip() == "</function>"
    # nor does a closing </tool_call> inside a value (a Write tool's content, say) end the block
    note = "a file that ends a call: </tool_call> (as this one does)"
    output = (
        f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{note}\n</parameter>\n</function>\n</tool_call>\nDone."
    )
    for size in (1, 3, len(output)):
        call, text = split(QWEN3_CODER, output, size)
        assert call.arguments["city"] == note and text.text.strip() == "Done."


def test_a_parsed_call_with_a_non_finite_number_is_no_call():
    """mlx-lm's parsers return objects parsed by json.loads, which reads 1e999 as inf."""
    with pytest.raises(ValueError, match="not a JSON number"):
        as_call({"name": "f", "arguments": {"x": [1.0, float("inf")]}})
    assert as_call({"name": "f", "arguments": '{"x": 1e99}'}) == ToolCall("f", {"x": 1e99})


def test_plain_text_passes_through_and_calls_can_be_capped():
    assert split(None, "  <tool_call>x\n", 3) == [Text("  <tool_call>x\n")]
    assert split(HERMES, "  hello \n", 1) == [Text("  hello \n")]  # no call: white space kept as written
    two = CASES[1][1]
    assert split(HERMES, two, 4, max_calls=1) == [Text("Checking both."), WEATHER]  # parallel_tool_calls false


def test_detect_format_and_forced_starts():
    assert detect_format("{% for tool in tools %}<tool_call>{% endfor %}") is HERMES
    assert detect_format("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]...[TOOL_CALLS]") is MISTRAL
    assert detect_format("<|start_header_id|>user<|end_header_id|>{{ tools }} 'parameters'") is LLAMA3
    assert detect_format("{{ messages }}") is None and detect_format(None) is None
    assert HERMES.forced(None) == "<tool_call>"
    assert HERMES.forced("get_time") == '<tool_call>\n{"name": "get_time", "arguments": '
    assert LLAMA3.forced("f") == '{"name": "f", "parameters": '
    forced = HERMES.forced("get_time")
    assert split(HERMES, forced + '{"tz": "UTC", "n": 2}}\n</tool_call>', 3) == [TIME]


TEMPLATE = "{{ tools }} <tool_call>"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def refusal(body: dict, template: str = TEMPLATE) -> RequestError:
    with pytest.raises(RequestError) as refused:
        chat_setup(ChatRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **body}), template)
    return refused.value


def test_chat_setup_checks():
    assert refusal({"tools": [{**TOOL, "extra": 1}]}).param == "tools[0].extra"
    assert refusal({"tools": [TOOL, TOOL]}).message == "'tools': two tools are named 'f'"
    assert refusal({"tools": [TOOL], "tool_choice": "sometimes"}).param == "tool_choice"
    assert refusal({"tool_choice": "required"}).param == "tool_choice"
    assert "does not render tools" in refusal({"tools": [TOOL]}, "{{ messages }}").message
    assert "format specfill does not read" in refusal({"tools": [TOOL]}, "{{ tools }} <function_call>").message
    assert refusal({"tools": [{"type": "function", "function": {"name": "a b"}}]}).param == "tools[0].function.name"
    setup = chat_setup(
        ChatRequest.model_validate(
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [TOOL],
                "tool_choice": "none",
                "response_format": {"type": "json_object"},
            }
        ),
        TEMPLATE,
    )
    assert setup.tools == () and setup.format is None and setup.prefix == "{"  # none: no tools in the template


def test_output_check():
    assert output_check({"type": "text"}) is None
    json_object = output_check({"type": "json_object"})
    assert json_object.check('{"a": 1}') is None and "not an object" in json_object.check("[1]")
    assert json_object.check("{'a': 1}").startswith("not JSON")
    schema = output_check(
        {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            },
        }
    )
    assert schema.check('{"n": 3}') is None and "['n']" in schema.check('{"n": "3"}')


def test_template_messages_pass_tool_calls_as_objects():
    request = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "done"}]},
            ]
        }
    )
    out = template_messages(request.messages, "Reply in JSON.")
    assert out[0] == {"role": "system", "content": "Reply in JSON."}
    assert out[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}  # as transformers / vLLM
    assert out[3] == {"role": "tool", "content": "done", "tool_call_id": "call_1"}


def test_anthropic_body_translation():
    request = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 9,
            "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["##"],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "metadata": {"user_id": "u", "method": "h2o"},
            "keep_ratio": 0.5,
            "thinking": {"type": "disabled"},
            "messages": [
                {"role": "user", "content": "Go"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Calling."},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        }
    )
    body = chat_body(request)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": "Calling.",
            "reasoning_content": "hm",  # its thinking block, for the template (Qwen3's renders it)
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "content": "ok", "tool_call_id": "toolu_1", "name": "f"},
        {"role": "user", "content": "Thanks"},
    ]
    assert body["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["stop"] == ["##"] and body["max_tokens"] == 9
    assert body["method"] == "h2o" and body["keep_ratio"] == 0.5 and "user_id" not in body
    with pytest.raises(RequestError, match="'tools\\[0\\].type': only custom tools"):
        chat_body(
            MessagesRequest.model_validate(
                {
                    "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                }
            )
        )


def test_tools_render_as_transformers_renders_them(tmp_path):
    """The server's rendering (chat.template_messages + the tokenizer's tools) equals transformers'
    apply_chat_template on the Qwen2.5-style tool template, and a template asking `tools is not none`
    sees None when a request has no tools, as under transformers."""
    transformers = pytest.importorskip("transformers")
    from specfill.core.io.tokenizer import load_tokenizer
    from tests.fixtures.tool_model import write_tool_checkpoint

    directory = write_tool_checkpoint(tmp_path / "tools")
    ours, reference = load_tokenizer(directory), transformers.AutoTokenizer.from_pretrained(str(directory))
    tools = [
        TOOL,
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": "G",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
            },
        },
    ]
    request = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": "Both.",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"n": 2}'}},
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2", "content": "two"},
            ]
        }
    )
    messages = template_messages(request.messages)
    for kwargs in ({"tools": tools}, {}):
        assert ours.apply_chat_template(
            messages, add_generation_prompt=True, **kwargs
        ) == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    ours.chat_template = reference.chat_template = "{% if tools is not none %}T{% endif %}{{ messages[0].content }}"
    assert (
        ours.apply_chat_template(messages[:1])
        == reference.apply_chat_template(messages[:1], tokenize=False)
        == "Be brief."
    )
