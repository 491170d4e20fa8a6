"""Tool calls and structured output on /v1/chat/completions through the official openai client
(issue 37 item 1), on the rote tool model (tests/fixtures/tool_model.py): the tools and the tool
results reach the model's template, its <tool_call> output comes back as tool_calls (whole and
streamed), tool_choice none / required / a named function, a malformed call as content, one 400
naming an unknown tool field, response_format checked."""

from __future__ import annotations

import json
import urllib.request

import openai
import pydantic
import pytest

from specfill.core.io.tokenizer import load_tokenizer
from specfill.serve.chat import chat_prompt, chat_setup
from specfill.serve.protocol import ChatRequest

from .conftest import TOOL_KEY

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def tokenize(server, body: dict) -> dict:
    request = urllib.request.Request(
        server.url + "/tokenize", data=json.dumps(body).encode(), headers={"Authorization": f"Bearer {TOOL_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.fixture(scope="module")
def c(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key=TOOL_KEY, max_retries=0)


def test_tool_round_trip(c, tool_server):
    first = c.chat.completions.create(model=tool_server.model, messages=ASK, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    turn = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    second = c.chat.completions.create(model=tool_server.model, messages=turn, tools=TOOLS)
    assert second.choices[0].message.tool_calls[0].function.name == "get_weather"  # the rote model's answer
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens  # turn 1 reused
    # the call and its result went through the model's own template: the server counted this prompt
    tokenizer = load_tokenizer(tool_server.checkpoint)
    request = ChatRequest.model_validate({"messages": turn, "tools": TOOLS})
    setup = chat_setup(request, tokenizer.chat_template)
    text = tokenizer.decode(chat_prompt(tokenizer, request, setup)[0])
    assert second.usage.prompt_tokens == len(chat_prompt(tokenizer, request, setup)[0])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert CALL_TEXT in text and '<tool_response>\n{"temperature": 21}\n</tool_response>' in text
    counted = tokenize(tool_server, {"messages": turn, "tools": TOOLS})
    assert counted["count"] == second.usage.prompt_tokens  # /tokenize renders tools and tool messages alike


def test_tool_calls_stream_as_deltas(c, tool_server):
    """A <tool_call> streams as the model writes it: index, id, type and name first, then the
    arguments in the pieces the model wrote (the rote model writes them in two tokens)."""
    chunks = list(c.chat.completions.create(model=tool_server.model, messages=ASK, tools=TOOLS, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert not any(d.content for d in deltas)  # no tag text leaks into the content
    first, *rest = [tc for d in deltas for tc in d.tool_calls or []]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert [r.function.arguments for r in rest] == ['{"city": ', '"Paris"}']
    assert all(r.index == 0 and r.id is None and r.function.name is None for r in rest)
    assert json.loads("".join(r.function.arguments for r in rest)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with c.chat.completions.stream(model=tool_server.model, messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_completion()  # the client's own accumulation of the deltas
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_tool_choice(c, tool_server):
    none = c.chat.completions.create(model=tool_server.model, messages=ASK, tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.content == CALL_TEXT  # unparsed, the special tags kept
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"
    named = c.chat.completions.create(
        model=tool_server.model,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"timezone": "UTC"}
    required = c.chat.completions.create(
        model=tool_server.model, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False
    )
    assert [t.function.name for t in required.choices[0].message.tool_calls] == ["get_weather"]
    with pytest.raises(openai.BadRequestError, match="not one of the request's tools"):
        c.chat.completions.create(
            model=tool_server.model,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "rm_rf"}},
        )


def test_malformed_call_is_content(c, tool_server):
    """A call cut short (here by a stop string) is no call: its text is the content, never a 500
    (a stream that announced the call keeps it, with the arguments it streamed: docs/serve.md)."""
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
    whole = c.chat.completions.create(model=tool_server.model, messages=ASK, tools=TOOLS, stop=["Paris"])
    assert whole.choices[0].message.content == cut and whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"
    # streamed, the call was announced before the cut: it keeps the arguments it had (no text leaks)
    chunks = list(
        c.chat.completions.create(model=tool_server.model, messages=ASK, tools=TOOLS, stop=["Paris"], stream=True)
    )
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert not any(d.content for d in deltas) and chunks[-1].choices[0].finish_reason == "stop"
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].function.name == "get_weather" and "".join(t.function.arguments for t in calls) == '{"city": "'
    short = c.chat.completions.create(model=tool_server.model, messages=ASK, tools=TOOLS, max_tokens=1)
    assert short.choices[0].message.content == "<tool_call>" and short.choices[0].finish_reason == "length"


def test_bad_tools_are_one_400_naming_the_field(c, tool_server, tiny_server):
    cases = {
        "tools[0].function.examples": [{"type": "function", "function": {**WEATHER["function"], "examples": []}}],
        "tools[1].cache": [WEATHER, {**TIME, "cache": True}],
        "tools[0].type": [{"type": "custom", "custom": {"name": "x"}}],
        "tools[0].function.parameters": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
        ],
    }
    for field, tools in cases.items():
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(model=tool_server.model, messages=ASK, tools=tools)
        assert refused.value.param == field and f"'{field}" in refused.value.message, refused.value.message
    plain = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not render tools"):  # chatml: tools would do nothing
        plain.chat.completions.create(model=tiny_server.model, messages=ASK, tools=TOOLS)
    with pytest.raises(openai.BadRequestError, match="tool calls"):
        plain.completions.create(model=tiny_server.model, prompt="1 2", extra_body={"tools": TOOLS})


class Weather(pydantic.BaseModel):
    city: str
    unit: str


def test_response_format(c, tool_server):
    """Constrained to the schema's structure (tests/serve/test_constrained.py) and validated against all
    of it: the reply starts with "{", the verdict is in specfill.response_format (a pattern is not
    constrained, so the rote model's answer fits the structure and fails the pattern)."""
    plain = [{"role": "user", "content": "Weather in Paris, as JSON?"}]
    done = c.chat.completions.create(model=tool_server.model, messages=plain, response_format={"type": "json_object"})
    assert json.loads(done.choices[0].message.content) == {"city": "Paris", "unit": "celsius"}
    assert done.model_extra["specfill"]["response_format"] == {"type": "json_object", "valid": True, "error": None}
    parsed = c.chat.completions.parse(model=tool_server.model, messages=plain, response_format=Weather)
    assert parsed.choices[0].message.parsed == Weather(city="Paris", unit="celsius")  # the client's own check
    digits = {"type": "string", "pattern": "^[0-9]+$"}
    schema = {"type": "object", "properties": {"city": digits, "unit": {"type": "string"}}, "required": ["city"]}
    wrong = c.chat.completions.create(
        model=tool_server.model,
        messages=plain,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )
    verdict = wrong.model_extra["specfill"]["response_format"]
    assert verdict["valid"] is False and "'Paris' does not match '^[0-9]+$'" in verdict["error"], verdict
    chunks = list(
        c.chat.completions.create(
            model=tool_server.model, messages=plain, stream=True, response_format={"type": "json_object"}
        )
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == done.choices[0].message.content
    for bad, field in (
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": 5}}}, "response_format.json_schema.schema"),
        ({"type": "json_object", "strict": True}, "response_format.strict"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(model=tool_server.model, messages=plain, response_format=bad)
        assert refused.value.param == field, refused.value.message
