"""Qwen3.5 / Qwen3-Coder's XML calls constrained (specfill/serve/reply_grammar.py, issue 46 item 6):
what the parameter grammar accepts and rejects, masks equal to reading every token whole, sampled
replies that the format's own reader (mlx-lm's qwen3_coder parser, or specfill's) reads back as
arguments of the schema, and the server answering tool_choice required / a named function with
such a call from a model that writes noise."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import openai
import pytest

from specfill.evaluation.serve_process import ServerProcess
from specfill.serve.chat import reply_grammar
from specfill.serve.reply_grammar import ReplyGrammar, automaton
from specfill.serve.token_mask import ConstrainedReply, TokenConstraint, Vocabulary
from specfill.serve.tool_parsers import FORMATS
from tests.serve.test_json_grammar import small_vocab, whole

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        "zone": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "unit"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
QWEN = FORMATS["qwen3_coder"].bind(TOOLS)


def block(name: str, value: str) -> str:
    return f"<parameter={name}>\n{value}\n</parameter>\n"


def reads(text: str) -> bool:
    machine = automaton(ReplyGrammar((("", json.dumps(WEATHER), ""),), arguments="xml"))
    return machine.complete(machine.feed(machine.initial, text))


@pytest.mark.parametrize(
    "text",
    [
        block("city", "Paris") + block("unit", "celsius"),
        block("city", "a <b> & \n c") + block("unit", "fahrenheit") + block("days", "-3"),
        block("city", "") + block("unit", "celsius") + block("where", '{"lat": 1.5}') + block("hourly", "true"),
        block("city", "x") + block("unit", "celsius") + block("zone", "null"),
        block("city", "x") + block("unit", "celsius") + block("zone", "UTC+1") + block("hourly", "false"),
    ],
)
def test_accepts_the_parameters_of_the_schema(text):
    assert reads(text)
    (call,) = QWEN.calls(f"\n<function=get_weather>\n{text}</function>\n")
    jsonschema.validate(call.arguments, WEATHER)  # what the format's reader makes of it


@pytest.mark.parametrize(
    "text",
    [
        block("unit", "celsius") + block("city", "Paris"),  # out of the order of `properties`
        block("city", "Paris"),  # a required parameter missing
        block("city", "Paris") + block("unit", "kelvin"),  # not one of the enum
        block("city", "Paris is far away") + block("unit", "celsius"),  # over maxLength
        block("city", "x") + block("unit", "celsius") + block("days", "1.5"),  # not an integer
        block("city", "x") + block("unit", "celsius") + block("where", "{}"),  # a nested required key missing
        block("city", "x") + block("unit", "celsius") + block("other", "1"),  # not a parameter of the tool
        block("city", "x") + block("unit", "celsius") + block("unit", "celsius"),  # twice
        block("city", "x") + block("unit", "celsius") + block("zone", "Europe/Paris"),  # no option fits
        block("city", "x") + "<parameter=unit>\ncelsius</parameter>\n",  # the closing tag on the value's line
        block("city", "x") + block("unit", "celsius")[:-1],  # unfinished
    ],
)
def test_rejects_what_the_schema_does_not_allow(text):
    assert not reads(text)


def test_required_and_named_calls_continue_the_forced_starts():
    named = reply_grammar(QWEN, "get_weather")
    assert named is not None and named.arguments == "xml" and named.start == "<tool_call>\n<function=get_weather>\n"
    machine = automaton(named)
    assert machine.complete(
        machine.feed(machine.initial, block("city", "x") + block("unit", "celsius") + "</function>\n</tool_call>")
    )
    required = reply_grammar(QWEN, None)
    machine = automaton(required)
    assert required.start == "<tool_call>\n<function=" and machine.feed(machine.initial, "get_weather>\n")
    assert not machine.feed(machine.initial, "get_time>\n")


def xml_vocab() -> tuple[list[str], Vocabulary]:
    """small_vocab's words plus the pieces of a call ("=" among them, so that the vocabulary can
    always go on), markers special."""
    words, _ = small_vocab(3)
    pieces = ["=", "\n</parameter>\n", "</parameter>", "\n</", "parameter>", "<parameter=", "city>\n", "unit>\n",
              "celsius", "fahrenheit", "days>\n", "zone>\n", "null", "hourly>\n", "true", "where>\n",
              '{"lat": ', "</function>\n"]  # fmt: skip
    texts = [*words, *pieces, "</tool_call>", "<|im_end|>"]
    return texts, Vocabulary(texts, [len(texts) - 2, len(texts) - 1], [len(texts) - 1])


def test_masks_equal_reading_each_token_and_calls_read_back():
    """Sampled replies under the mask (tokens with markup favoured, so that values close): every
    mask is exactly the tokens whose text the automaton reads whole, and every finished reply is a
    call whose arguments, as the format's reader reads them, match the schema."""
    texts, vocab = xml_vocab()
    constraint = TokenConstraint(automaton(reply_grammar(QWEN, "get_weather")), vocab)
    favoured = np.array([3.0 if ("<" in t or "\n" in t) else 0.0 for t in texts], np.float32)
    finished = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        processor, ids, reply = ConstrainedReply(constraint), [0], ""
        for _ in range(300):
            logits = processor(ids, favoured + 2 * rng.standard_normal(vocab.size).astype(np.float32))
            mask = constraint.mask(processor.state)
            assert mask is not None and np.array_equal(mask, whole(constraint, texts, processor.state)), reply
            token = int(np.argmax(logits))
            ids.append(token)
            if token in vocab.eos:
                break
            reply += texts[token]
        if token in vocab.eos:
            finished += 1
            assert reply.endswith("</function>\n</tool_call>"), reply
            (call,) = QWEN.calls("\n<function=get_weather>\n" + reply.removesuffix("</tool_call>"))
            jsonschema.validate(call.arguments, WEATHER)
    assert finished >= 5


def test_text_fast_path_counts_maxlength():
    texts, vocab = xml_vocab()
    machine = automaton(ReplyGrammar((("", json.dumps(WEATHER), ""),), arguments="xml"))
    constraint = TokenConstraint(machine, vocab)
    state = machine.feed(machine.initial, "<parameter=city>\nabcdefghij")  # 2 of 12 characters left
    assert machine.in_text(state) == ("xml", 2)
    mask = constraint.mask(state)
    assert np.array_equal(mask, whole(constraint, texts, state))
    assert not any(mask[i] for i, t in enumerate(texts) if "\n" not in t and len(t) > 2)
    assert mask[texts.index("\n</parameter>\n")]


@pytest.fixture(scope="module")
def noise_server(tmp_path_factory: pytest.TempPathFactory):
    from tests.fixtures.tool_model import write_random_tool_checkpoint

    checkpoint = write_random_tool_checkpoint(tmp_path_factory.mktemp("noise") / "noise-qwen35", qwen35=True)
    server = ServerProcess("--model", str(checkpoint), log=tmp_path_factory.mktemp("serve") / "noise-qwen35.log")
    yield server
    server.stop()


@pytest.mark.parametrize("seed", (0, 1))
def test_server_answers_required_and_named_with_a_call_of_the_schema(noise_server, seed):
    """A model that writes noise (its template Qwen3.5's XML form) answers tool_choice required and a
    named function with one call whose arguments match the schema (unconstrained it writes none)."""
    client = openai.OpenAI(base_url=noise_server.url + "/v1", api_key="none", max_retries=0)
    asked = {"model": noise_server.model, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS}
    noise = {"seed": seed, "temperature": 1.5, "max_tokens": 200}
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = client.chat.completions.create(**asked, tool_choice=choice, **noise)
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    free = client.chat.completions.create(**asked, extra_body={"lazy_grammar": False}, **noise)
    assert not free.choices[0].message.tool_calls
