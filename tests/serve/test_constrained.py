"""Constrained decoding on the server (issue 46 item 6): a model with random weights, whose replies
are noise, answers tool_choice required / a named function (OpenAI chat) and tool_choice any / tool
(Anthropic Messages) with one call whose arguments match the tool's schema, and a json_schema
response_format with JSON of that schema, at a high temperature on several seeds. Unconstrained
(tool_choice auto) the same model writes no call."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from specfill.evaluation.serve_process import ServerProcess

KEY = "sk-noise-0123456789"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        "hourly": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4},
    },
    "required": ["city", "unit"],
}
TIME = {
    "type": "object",
    "properties": {"zone": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]}},
    "required": ["zone"],
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
SEEDS = (0, 1, 2)
NOISE = {"temperature": 1.5, "max_tokens": 200}


@pytest.fixture(scope="module")
def noise_server(tmp_path_factory: pytest.TempPathFactory):
    from tests.fixtures.tool_model import write_random_tool_checkpoint

    checkpoint = write_random_tool_checkpoint(tmp_path_factory.mktemp("noise") / "noise-tools")
    server = ServerProcess(
        "--model", str(checkpoint), "--api-key", KEY, log=tmp_path_factory.mktemp("serve") / "noise.log"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def c(noise_server):
    return openai.OpenAI(base_url=noise_server.url + "/v1", api_key=KEY, max_retries=0)


def one_call(reply) -> tuple[str, dict]:
    (call,) = reply.choices[0].message.tool_calls
    return call.function.name, json.loads(call.function.arguments)


@pytest.mark.parametrize("seed", SEEDS)
def test_named_and_required_calls_match_the_schema(c, noise_server, seed):
    named = c.chat.completions.create(
        model=noise_server.model,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        seed=seed,
        **NOISE,
    )
    name, arguments = one_call(named)
    assert name == "get_time"
    jsonschema.validate(arguments, TIME)
    required = c.chat.completions.create(
        model=noise_server.model, messages=ASK, tools=TOOLS, tool_choice="required", seed=seed, **NOISE
    )
    name, arguments = one_call(required)
    jsonschema.validate(arguments, SCHEMAS[name])


def test_unconstrained_the_model_writes_noise(c, noise_server):
    for seed in SEEDS:
        reply = c.chat.completions.create(model=noise_server.model, messages=ASK, tools=TOOLS, seed=seed, **NOISE)
        assert not reply.choices[0].message.tool_calls


@pytest.mark.parametrize("seed", SEEDS)
def test_response_format_json_schema(c, noise_server, seed):
    reply = c.chat.completions.create(
        model=noise_server.model,
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}},
        seed=seed,
        **NOISE,
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), WEATHER)


@pytest.mark.parametrize("run", SEEDS)
def test_anthropic_tool_and_any(noise_server, run):
    """The Messages route has no seed: three unseeded runs."""
    client = anthropic.Anthropic(base_url=noise_server.url, api_key=KEY, max_retries=0)
    tools = [{"name": n, "input_schema": s} for n, s in SCHEMAS.items()]
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        message = client.messages.create(
            model=noise_server.model,
            messages=ASK,
            tools=tools,
            tool_choice=choice,
            max_tokens=200,
            extra_body={"temperature": 1.0},
        )
        (block,) = [b for b in message.content if b.type == "tool_use"]
        assert choice["type"] == "any" or block.name == "get_weather"
        jsonschema.validate(block.input, SCHEMAS[block.name])
