"""Anthropic's Messages API through the official anthropic client (issue 37 item 2), on the rote tool
model: tool_use / tool_result round trip with the prompt cache's cache_read_input_tokens, the event
stream, stop sequences, count_tokens, Anthropic error bodies, x-api-key and Bearer keys, specfill's
fields in metadata."""

from __future__ import annotations

import http.client
import json

import pytest

from .conftest import TOOL_KEY

anthropic = pytest.importorskip("anthropic")

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"name": "get_time", "input_schema": {"type": "object"}}
ASK = [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def c(tool_server):
    return anthropic.Anthropic(base_url=tool_server.url, api_key=TOOL_KEY, max_retries=0)


def post(server, path: str, body: dict | None, headers: dict) -> tuple[int, dict]:
    """(status, JSON body) of a POST (a GET with no body)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request(
        "GET" if body is None else "POST",
        path,
        body=None if body is None else json.dumps(body),
        headers={"content-type": "application/json", **headers},
    )
    response = connection.getresponse()
    reply = json.loads(response.read())
    connection.close()
    return response.status, reply


def test_tool_use_round_trip(c, tool_server):
    first = c.messages.create(
        model=tool_server.model, max_tokens=32, system="Be brief.", messages=ASK, tools=[WEATHER, TIME]
    )
    assert first.stop_reason == "tool_use" and first.role == "assistant" and first.id.startswith("msg_")
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("toolu_")
    assert first.usage.output_tokens == 6 and first.usage.input_tokens > 0
    turn = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [{"type": "text", "text": '{"temperature": 21}'}],
                }
            ],
        },
    ]
    second = c.messages.create(
        model=tool_server.model, max_tokens=32, system="Be brief.", messages=turn, tools=[WEATHER, TIME]
    )
    assert second.content[0].type == "tool_use"
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= total  # turn 1 (and its reply) came from the prompt cache
    counted = c.messages.count_tokens(model=tool_server.model, system="Be brief.", messages=turn, tools=[WEATHER, TIME])
    assert counted.input_tokens == second.usage.input_tokens + second.usage.cache_read_input_tokens


def test_stream_events(c, tool_server):
    with c.messages.stream(model=tool_server.model, max_tokens=32, messages=ASK, tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert [e.partial_json for e in events if e.type == "input_json"] == ['{"city": ', '"Paris"}']
    assert [k for k in kinds if k not in ("ping", "input_json", "text")] == [
        "message_start",
        "content_block_start",
        "content_block_delta",  # the input as the model wrote it: '{"city": ', then '"Paris"}'
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Paris"}
    assert final.usage.output_tokens == 6
    # a call cut short after it was announced keeps the input it streamed (the client parses it partially)
    with c.messages.stream(
        model=tool_server.model, max_tokens=32, messages=ASK, tools=[WEATHER], stop_sequences=["Paris"]
    ) as stream:
        partial = "".join(e.partial_json for e in stream if e.type == "input_json")
        cut_call = stream.get_final_message()
    assert partial == '{"city": "' and cut_call.content[0].type == "tool_use"
    assert cut_call.stop_reason == "stop_sequence" and cut_call.content[0].name == "get_weather"
    with c.messages.stream(model=tool_server.model, max_tokens=32, messages=ASK, stop_sequences=["Paris"]) as stream:
        text = "".join(stream.text_stream)
        cut = stream.get_final_message()
    assert text == CALL_TEXT[: CALL_TEXT.index("Paris")]  # no tools: the text as the model wrote it, tags kept
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "Paris"


def test_text_replies_and_tool_choice(c, tool_server):
    plain = c.messages.create(
        model=tool_server.model, max_tokens=32, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text == CALL_TEXT
    assert plain.stop_reason == "end_turn"
    named = c.messages.create(
        model=tool_server.model,
        max_tokens=32,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    assert named.content[0].name == "get_time" and named.content[0].input == {"timezone": "UTC"}
    short = c.messages.create(model=tool_server.model, max_tokens=1, messages=ASK, tools=[WEATHER])
    assert short.stop_reason == "max_tokens" and short.content[0].text == "<tool_call>"  # a call cut short: text


def test_structured_output(c, tool_server):
    """output_config.format: the chat route's response_format json_schema (validated, not constrained)."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    done = c.messages.create(
        model=tool_server.model,
        max_tokens=32,
        messages=ASK,
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}},
    )
    assert json.loads(done.content[0].text) == {"city": "Paris", "unit": "celsius"}
    assert done.model_extra["specfill"]["response_format"]["valid"] is True
    with pytest.raises(anthropic.BadRequestError, match="output_config.format.schema"):
        c.messages.create(
            model=tool_server.model,
            max_tokens=4,
            messages=ASK,
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": {"type": 3}}}},
        )


def test_specfill_fields_in_metadata(c, tool_server):
    done = c.messages.create(
        model=tool_server.model,
        max_tokens=4,
        messages=[{"role": "user", "content": "Hi there"}],
        metadata={"user_id": "u1", "method": "h2o", "prompt_cache": "off"},
        extra_body={"h2o_local": 8},
    )
    assert done.model_extra["specfill"]["method"] == "h2o" and done.model_extra["specfill"]["prompt_cache"] == "off"
    with pytest.raises(anthropic.BadRequestError, match="method must be full, h2o, specprefill or auto"):
        c.messages.create(model=tool_server.model, max_tokens=4, messages=ASK, metadata={"method": "magic"})


def test_errors_have_anthropics_shape(c, tool_server):
    with pytest.raises(anthropic.BadRequestError) as refused:
        c.messages.create(
            model=tool_server.model,
            max_tokens=4,
            messages=ASK,
            tools=[{**WEATHER, "cache_control": {"type": "ephemeral"}, "examples": []}],
        )
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    assert refused.value.body["error"]["message"].startswith("unknown field 'tools[0].examples' (allowed: ")
    with pytest.raises(anthropic.BadRequestError, match="'temperature'"):
        c.messages.create(model=tool_server.model, max_tokens=4, messages=ASK, extra_body={"temperature": "hot"})
    with pytest.raises(anthropic.BadRequestError, match="'messages\\[0\\].content\\[0\\]': content of type 'image'"):
        c.messages.create(
            model=tool_server.model,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                    ],
                }
            ],
        )
    with pytest.raises(anthropic.NotFoundError) as missing:
        c.messages.create(model="not-served-here", max_tokens=4, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"
    status, body = post(tool_server, "/v1/messages", {"messages": ASK}, {"x-api-key": TOOL_KEY})
    assert status == 400 and body["error"]["message"].startswith("missing field 'max_tokens'")
    with pytest.raises(anthropic.AuthenticationError) as refused_key:
        anthropic.Anthropic(base_url=tool_server.url, api_key="wrong", max_retries=0).messages.create(
            model=tool_server.model, max_tokens=4, messages=ASK
        )
    assert refused_key.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": refused_key.value.body["error"]["message"]},
    }
    status, body = post(
        tool_server, "/v1/messages", {"messages": ASK, "max_tokens": 2}, {"authorization": f"Bearer {TOOL_KEY}"}
    )  # Claude Code's ANTHROPIC_AUTH_TOKEN header
    assert status == 200 and body["type"] == "message"
    status, body = post(tool_server, "/v1/models", None, {"x-api-key": TOOL_KEY})  # the key works on every route
    assert status == 200 and body["data"][0]["id"] == tool_server.model
