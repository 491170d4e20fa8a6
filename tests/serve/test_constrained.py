"""Constrained decoding on the server (issue 46 item 6): a model with random weights, whose replies
are noise, answers tool_choice required / a named function (OpenAI chat) and tool_choice any / tool
(Anthropic Messages) with one call whose arguments match the tool's schema, and a json_schema
response_format with JSON of that schema, at a high temperature on several seeds. Unconstrained
(tool_choice auto, lazy_grammar false) the same model writes no call. Under tool_choice auto a noise model that opens
a call by itself (`<tool_call>` after the prompt's last new line) writes valid calls only with the
lazy grammar (each call constrained from its opening on)."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import numpy as np
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


def write_trigger_checkpoint(directory):
    """The rote tool model's vocabulary and template, its layers still adding nothing (so the next
    token depends on the current one alone), its LM head random (noise at a high temperature)
    except that a new line is followed by `<tool_call>`: the model opens a call by itself (right
    after the generation prompt's new line), and what follows is noise."""
    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer

    from tests.fixtures.tool_model import write_tool_checkpoint

    write_tool_checkpoint(directory)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    newline, call = tok.token_to_id("Ċ"), tok.token_to_id("<tool_call>")
    weights = load_file(str(directory / "model.safetensors"))
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    slot = int(np.argmax(embed[newline]))  # the new line's embedding is one unit vector (its slot)
    embed[np.arange(len(embed)) != newline, slot] = 0.0  # only the new line reaches that slot
    head[:] = 0.3 * np.random.default_rng(0).standard_normal(head.shape).astype(np.float32)
    head[call] = 0.0
    head[call, slot] = 10.0
    save_file(weights, str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def trigger_server(tmp_path_factory: pytest.TempPathFactory):
    checkpoint = write_trigger_checkpoint(tmp_path_factory.mktemp("trigger") / "trigger-tools")
    server = ServerProcess(
        "--model", str(checkpoint), "--api-key", KEY, log=tmp_path_factory.mktemp("serve") / "trigger.log"
    )
    yield server
    server.stop()


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
    """tool_choice auto without the lazy grammar (with it, a `<tool_call>` the noise happens to
    write becomes a valid call: seed 0 does)."""
    for seed in SEEDS:
        reply = c.chat.completions.create(
            model=noise_server.model, messages=ASK, tools=TOOLS, seed=seed, extra_body={"lazy_grammar": False}, **NOISE
        )
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


def test_auto_calls_are_constrained_from_their_opening(trigger_server):
    """tool_choice auto: the model opens a call itself and writes noise after it; with the lazy
    grammar every call it opens is one of the tools with arguments of its schema; without it
    (lazy_grammar false) the same replies hold no call."""
    c = openai.OpenAI(base_url=trigger_server.url + "/v1", api_key=KEY, max_retries=0)
    for seed in SEEDS:
        asked = {"model": trigger_server.model, "messages": ASK, "tools": TOOLS, "seed": seed, **NOISE}
        reply = c.chat.completions.create(**asked)
        calls = reply.choices[0].message.tool_calls
        assert calls, reply.choices[0].message.content
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        free = c.chat.completions.create(**asked, extra_body={"lazy_grammar": False}).choices[0].message
        assert not free.tool_calls and free.content.startswith("<tool_call>"), free
