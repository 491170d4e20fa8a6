"""A Qwen3.5-style chat template with tools (tests/fixtures/tool_model.py): the model's call in
Qwen3.5's XML form (`<tool_call><function=...><parameter=...>`, the qwen3_coder format) comes back
as `tool_calls` on /v1/chat/completions and as a `tool_use` block on /v1/messages, whole and
streamed, through the official openai and anthropic clients (issue 46). With mlx-lm installed its
qwen3_coder parser reads the call, typing each value by the tool's schema (the postcode "75001" is
a string there); without it, specfill's own reader does (75001, a number)."""

from __future__ import annotations

import json

import openai
import pytest

from specfill.core.io.tokenizer import load_tokenizer
from specfill.evaluation.serve_process import ServerProcess
from specfill.serve.chat import chat_prompt, chat_setup
from specfill.serve.protocol import ChatRequest
from specfill.serve.tool_mlx import mlx_available
from tests.fixtures.tool_model import QWEN35_CALL, write_qwen35_tool_checkpoint

anthropic = pytest.importorskip("anthropic")

WEATHER = {
    "name": "get_weather",
    "description": "The weather at a place",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "postcode": {"type": "string"}},
        "required": ["city"],
    },
}
TOOLS = [{"type": "function", "function": WEATHER}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
ARGUMENTS = {"city": "Paris", "postcode": "75001" if mlx_available() else 75001}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    checkpoint = write_qwen35_tool_checkpoint(tmp_path_factory.mktemp("qwen35") / "tiny-qwen35-tools")
    process = ServerProcess(
        "--model", str(checkpoint), "--max-tokens", "32", log=tmp_path_factory.mktemp("serve") / "qwen35.log"
    )
    process.checkpoint = checkpoint
    yield process
    process.stop()


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def test_openai_tool_calls(oa, server):
    reply = oa.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGUMENTS
    # the call goes back through the template in its XML form, with the tool's result
    turn = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    again = oa.chat.completions.create(model=server.model, messages=turn, tools=TOOLS)
    assert again.choices[0].message.tool_calls[0].function.name == "get_weather"
    tokenizer = load_tokenizer(server.checkpoint)
    request = ChatRequest.model_validate({"messages": turn, "tools": TOOLS})
    ids, _ = chat_prompt(tokenizer, request, chat_setup(request, tokenizer.chat_template))
    assert again.usage.prompt_tokens == len(ids)
    text = tokenizer.decode(ids)
    assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    unparsed = oa.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, tool_choice="none")
    assert unparsed.choices[0].message.content == QWEN35_CALL and unparsed.choices[0].message.tool_calls is None


def test_openai_stream(oa, server):
    chunks = list(oa.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert not any(d.content for d in deltas)  # no tag text leaks into the content
    (call,) = [tc for d in deltas for tc in d.tool_calls or []]  # one delta, once the call is complete
    assert call.index == 0 and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with oa.chat.completions.stream(model=server.model, messages=ASK, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == ARGUMENTS


def test_anthropic_tool_use(an, server):
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    reply = an.messages.create(model=server.model, max_tokens=32, messages=ASK, tools=tools)
    assert reply.stop_reason == "tool_use"
    (use,) = reply.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == ARGUMENTS
    with an.messages.stream(model=server.model, max_tokens=32, messages=ASK, tools=tools) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].name == "get_weather" and final.content[0].input == ARGUMENTS
    assert "content_block_start" in events and "text" not in events
