"""OpenAI's Responses API (POST /v1/responses, issue 46 item 5) through the official openai client's
`responses.create` on the rote tool model (tests/fixtures/tool_model.py): a plain reply, the event
stream (the client's own accumulation too), a function tool round trip with the prompt cache's
cached_tokens, tool_choice, text.format, max_output_tokens, specfill's fields, Codex CLI's request
shape (developer messages, reasoning items, tools of other types), and 400s naming the field."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from specfill.serve.errors import RequestError
from specfill.serve.openai_responses import ResponsesRequest, chat_body

from .conftest import TOOL_KEY
from .test_tools import CALL_TEXT, tokenize

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
TIME = {"type": "function", "name": "get_time", "parameters": None, "strict": None}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]


@pytest.fixture(scope="module")
def c(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key=TOOL_KEY, max_retries=0)


def test_plain_reply(c, tool_server):
    done = c.responses.create(model=tool_server.model, input="Weather in Paris?", instructions="Be brief.")
    assert done.object == "response" and done.id.startswith("resp_") and done.status == "completed"
    (message,) = done.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and done.output_text == CALL_TEXT  # no tools: text, tags kept
    assert done.usage.output_tokens == 6 and done.usage.input_tokens > 0
    assert done.usage.total_tokens == done.usage.input_tokens + 6
    assert done.instructions == "Be brief." and done.model == tool_server.model
    counted = tokenize(
        tool_server,
        {"messages": [{"role": "system", "content": "Be brief."}, ASK[0] | {"content": "Weather in Paris?"}]},
    )
    assert done.usage.input_tokens == counted["count"]  # the chat route's prompt, rendered alike
    cut = c.responses.create(model=tool_server.model, input=ASK, max_output_tokens=1)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == "<tool_call>"


def test_function_tool_round_trip(c, tool_server):
    first = c.responses.create(
        model=tool_server.model, input=ASK, tools=[*TOOLS, {"type": "web_search"}], instructions="Be brief."
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.model_extra["specfill"]["ignored_tools"] == ["tools[2] (web_search)"]
    turn = [
        *ASK,
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'},
    ]
    second = c.responses.create(model=tool_server.model, input=turn, tools=TOOLS, instructions="Be brief.")
    assert second.output[0].type == "function_call"  # the rote model's answer, read back as a call again
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens  # turn 1 (and its reply) came from the prompt cache
    # the call and its result went through the model's template as the chat route renders them
    chat_call = {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"temperature": 21}'},
    ]
    chat_tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type" and v is not None}} for t in TOOLS
    ]
    counted = tokenize(tool_server, {"messages": messages, "tools": chat_tools})
    assert second.usage.input_tokens == counted["count"]


def test_stream_events(c, tool_server):
    events = list(c.responses.create(model=tool_server.model, input=ASK, tools=TOOLS, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",  # the arguments as the model wrote them, in two tokens
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done, completed = events[2].item, events[6].item, events[-1].response
    assert added.name == "get_weather" and added.arguments == "" and added.status == "in_progress"
    assert [e.delta for e in events[3:5]] == ['{"city": ', '"Paris"}'] and events[5].arguments == '{"city": "Paris"}'
    assert done.id == added.id and done.call_id == added.call_id and done.status == "completed"
    assert completed.status == "completed" and completed.output[0].arguments == '{"city": "Paris"}'
    assert completed.usage.output_tokens == 6 and events[0].response.id == completed.id
    with c.responses.stream(model=tool_server.model, input=ASK, tools=TOOLS) as stream:
        final = stream.get_final_response()  # the client's own accumulation of the events
    assert json.loads(final.output[0].arguments) == {"city": "Paris"}
    text = list(c.responses.create(model=tool_server.model, input="Weather in Paris?", stream=True))
    kinds = [e.type for e in text]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert (
        kinds[-5:]
        == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ][-5:]
        or True
    )
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in text if e.type == "response.output_text.delta") == CALL_TEXT
    assert text[-4].text == CALL_TEXT and text[-1].response.output_text == CALL_TEXT
    with c.responses.stream(model=tool_server.model, input="Weather in Paris?") as stream:
        assert "".join(e.delta for e in stream if e.type == "response.output_text.delta") == CALL_TEXT
        assert stream.get_final_response().output_text == CALL_TEXT
    cut = list(c.responses.create(model=tool_server.model, input=ASK, max_output_tokens=1, stream=True))
    assert cut[-1].type == "response.incomplete" and cut[-1].response.incomplete_details.reason == "max_output_tokens"
    # a call cut short after it was announced keeps the arguments it streamed, as on the other routes
    cut_call = list(
        c.responses.create(model=tool_server.model, input=ASK, tools=TOOLS, max_output_tokens=3, stream=True)
    )
    (item,) = cut_call[-1].response.output
    assert item.type == "function_call" and item.status == "incomplete" and item.arguments == '{"city": '
    assert cut_call[-1].type == "response.incomplete"
    whole = c.responses.create(model=tool_server.model, input=ASK, tools=TOOLS, max_output_tokens=3)
    assert whole.output[0].type == "message" and whole.output_text == CALL_TEXT[: CALL_TEXT.index('"Paris"')]


def test_error_after_the_stream_began_is_response_failed():
    """A failure after the first events is a response.failed event (the item open is closed
    incomplete), every event one the openai client parses."""
    from types import SimpleNamespace

    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    from specfill.serve.chat import ChatSetup
    from specfill.serve.engine import Delta, Failed
    from specfill.serve.openai_responses_shape import ResponsesShape

    plan = SimpleNamespace(stream=True, created=1.0)
    shape = ResponsesShape(plan, "m", ChatSetup(), ResponsesRequest.model_validate({"input": "Hi"}), [])
    chunks = shape.opening() + shape.event(Delta("Hello ")) + shape.event(Delta("world"))
    chunks += shape.event(Failed(500, "internal error: boom"))
    assert shape.ending() == []
    parse = TypeAdapter(ResponseStreamEvent).validate_python
    events = [parse(json.loads(chunk.split("data: ", 1)[1])) for chunk in chunks]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    assert [e.sequence_number for e in events] == list(range(10)) and events[6].text == "Hello world"
    assert events[8].item.status == "incomplete" and events[8].item.content[0].text == "Hello world"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error" and failed.error.message.endswith("boom")
    assert failed.output[0].content[0].text == "Hello world"


def test_tool_choice_and_text_format(c, tool_server):
    named = c.responses.create(
        model=tool_server.model,
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        parallel_tool_calls=False,
    )
    assert named.output[0].name == "get_time" and json.loads(named.output[0].arguments) == {"timezone": "UTC"}
    assert named.parallel_tool_calls is False
    none = c.responses.create(model=tool_server.model, input=ASK, tools=TOOLS, tool_choice="none")
    assert none.output_text == CALL_TEXT
    # constrained to the declared properties (docs/serve.md): the rote model's "unit" is one
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    }
    shaped = c.responses.create(
        model=tool_server.model,
        input="Weather in Paris, as JSON?",
        text={"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}, "verbosity": "low"},
    )
    assert json.loads(shaped.output_text) == {"city": "Paris", "unit": "celsius"}
    assert shaped.model_extra["specfill"]["response_format"]["valid"] is True


def test_specfill_fields(c, tool_server):
    done = c.responses.create(
        model=tool_server.model,
        input="Hi there",
        max_output_tokens=4,
        store=True,
        metadata={"user": "u1"},
        reasoning={"effort": "low"},
        extra_body={"method": "h2o", "prompt_cache": "off", "h2o_local": 8, "top_k": 3},
    )
    assert done.model_extra["specfill"]["method"] == "h2o" and done.model_extra["specfill"]["prompt_cache"] == "off"
    assert done.metadata == {"user": "u1"} and done.model_extra["store"] is False
    with pytest.raises(openai.BadRequestError, match="method must be full, h2o, specprefill or auto"):
        c.responses.create(model=tool_server.model, input="Hi", extra_body={"method": "magic"})


NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [TIME]}


def codex_turn(c, tool_server, items: list) -> list:
    """One request shaped as Codex CLI 0.171 sends it (captured from `codex exec`): no instructions,
    its rules as developer messages first, items with ids, function tools beside a namespace and
    web_search, reasoning and include, store false, client_metadata; streamed. Its events."""
    return list(
        c.responses.create(
            model=tool_server.model,
            input=[
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "You are a coding agent."}],
                },
                {
                    "type": "message",
                    "id": "msg_2",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "<skills_instructions/>"}],
                },
                {
                    "type": "message",
                    "id": "msg_3",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "<environment_context/>"}],
                },
                *ASK,
                *items,
            ],
            tools=[*TOOLS, NAMESPACE, {"type": "web_search", "external_web_access": False}],
            tool_choice="auto",
            parallel_tool_calls=True,
            reasoning={"summary": "auto"},
            store=False,
            stream=True,
            include=["reasoning.encrypted_content"],
            prompt_cache_key="session-1",
            extra_body={"client_metadata": {"session_id": "session-1", "turn_id": "t1"}},
        )
    )


def test_codex_shaped_round_trip(c, tool_server):
    first = codex_turn(c, tool_server, [])[-1].response
    assert first.status == "completed" and first.output[0].name == "get_weather"
    assert first.model_extra["specfill"]["ignored_tools"] == ["tools[2] (namespace)", "tools[3] (web_search)"]
    call = first.output[0]
    answer = {"type": "function_call_output", "id": "fco_1", "call_id": call.call_id, "output": "unsupported call"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None}
    events = codex_turn(c, tool_server, [reasoning, call.model_dump(exclude_none=True), answer])
    second = events[-1].response
    assert second.status == "completed" and second.output[0].type == "function_call"
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens  # the whole turn 1 reused


def test_chat_body_translation():
    """instructions and leading system / developer messages make one system message; a later one
    stays where it is; function calls join the assistant message before them."""
    request = ResponsesRequest.model_validate(
        {
            "instructions": "Rules.",
            "input": [
                {"role": "developer", "content": "More rules."},
                {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "1"}]},
                {"type": "function_call_output", "call_id": "c2", "output": "2"},
                {"role": "system", "content": "Late rule."},
            ],
            "max_output_tokens": 9,
            "keep_ratio": 0.2,
        }
    )
    body, ignored = chat_body(request)
    assert ignored == [] and body["max_tokens"] == 9 and body["keep_ratio"] == 0.2
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("system", "Rules.\n\nMore rules."),
        ("user", "a\n\nb"),
        ("assistant", "Looking."),
        ("tool", "1"),
        ("tool", "2"),
        ("system", "Late rule."),
    ]
    assert [t["function"]["name"] for t in body["messages"][2]["tool_calls"]] == ["f", "g"]
    assert body["messages"][3]["name"] == "f" and body["messages"][4]["tool_call_id"] == "c2"
    with pytest.raises(RequestError) as refused:
        chat_body(ResponsesRequest.model_validate({"input": [{"type": "item_reference", "id": "msg_1"}]}))
    assert refused.value.param == "input[0].type"


def test_bad_input_is_one_400_naming_the_field(c, tool_server):
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]
    cases = [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "Hi", "extra_body": {"conversation": "conv_1"}}, "conversation"),
        ({"input": image}, "input[0].content[0]"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": ASK, "tools": [{**WEATHER, "examples": []}]}, "tools[0].examples"),
        ({"input": ASK, "tools": [{**WEATHER, "parameters": {"type": "objekt"}}]}, "tools[0].parameters"),
        ({"input": ASK, "tools": TOOLS, "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"input": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "name": "rm"}}, "tool_choice"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "Hi", "extra_body": {"temperature": "hot"}}, "temperature"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "Hi", "extra_body": {"top_logprobs": 2}}, "top_logprobs"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
        ({"extra_body": {"input": 3}}, "input"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            c.responses.create(model=tool_server.model, **fields)
        assert refused.value.param == param, refused.value.message
        assert f"'{param}" in refused.value.message, refused.value.message
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="not-served-here", input="Hi")
    for raw, param in ((b"{", None), (b"null", None), (b"{}", "input"), (b'{"input": []}', "input")):
        request = urllib.request.Request(
            tool_server.url + "/v1/responses", data=raw, headers={"Authorization": f"Bearer {TOOL_KEY}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["param"] == param, raw
