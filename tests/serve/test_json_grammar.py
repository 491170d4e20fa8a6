"""The JSON-schema automaton of constrained decoding (specfill/serve/json_grammar.py) and its token
masks (token_mask.py): what it accepts and rejects, masks equal to reading every token's text
whole, and the call grammars of the formats whose arguments are JSON."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import jsonschema
import numpy as np
import pytest

from specfill.serve.chat import chat_setup, output_check, output_grammar, reply_grammar
from specfill.serve.protocol import ChatRequest
from specfill.serve.reply_grammar import ReplyGrammar, automaton
from specfill.serve.token_mask import ConstrainedReply, LazyReply, TokenConstraint, Vocabulary
from specfill.serve.tool_parsers import FORMATS

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        "tags": {"type": "array", "items": {"type": "boolean"}},
    },
    "required": ["unit", "city"],
}


def reads(schema, text: str, start: str = "") -> bool:
    machine = automaton(ReplyGrammar((("", json.dumps(schema), ""),), start))
    return machine.complete(machine.feed(machine.initial, text))


@pytest.mark.parametrize(
    "text",
    [
        '{"city": "Paris", "unit": "celsius"}',
        '{"city":"P\\u00e9\\n","unit":"fahrenheit","days":-12}',
        '{\n"city": "x",\n"unit": "celsius", "where": {"lat": 1.5e-3}, "tags": [true, false]}',
        '{"city": "", "unit": "celsius", "tags": []}',
        '{"city": "", "unit": "celsius", "where": {"lat": -999999999999999.5E+99}}',  # the largest it allows
    ],
)
def test_accepts_the_schemas_json(text):
    jsonschema.validate(json.loads(text), WEATHER)
    assert reads(WEATHER, text)


@pytest.mark.parametrize(
    "text",
    [
        '{"unit": "celsius", "city": "Paris"}',  # required first, in the order of `properties`
        '{"city": "Paris"}',  # a required property missing
        '{"city": "Paris", "unit": "kelvin"}',  # not one of the enum
        '{"city": "Paris!!", "unit": "celsius"}',  # over maxLength
        '{"city": "x", "unit": "celsius", "days": 1.5}',  # not an integer
        '{"city": "x", "unit": "celsius", "days": 01}',  # a leading zero
        '{"city": "x", "unit": "celsius", "other": 1}',  # additional properties
        '{"city": "x", "unit": "celsius",}',  # a trailing comma
        '{"city":  "x", "unit": "celsius"}',  # two spaces between tokens
        '{"city": "a\\q", "unit": "celsius"}',  # a bad escape
        '{"city": "a\tb", "unit": "celsius"}',  # a control character in a string
        '{"city": "x", "unit": "celsius", "where": {}}',  # a nested required property missing
        '{"city": "x", "unit": "celsius", "tags": [1]}',  # an array item of the wrong type
        '{"city": "x", "unit": "celsius"',  # unfinished
        '{"city": "x", "unit": "celsius", "where": {"lat": 1e999}}',  # past a double's range: inf
    ],
)
def test_rejects_what_the_schema_does_not_allow(text):
    assert not reads(WEATHER, text)


def test_any_value_anyof_const_and_refs():
    assert reads({"type": "array"}, '[1, {"a": [null, "x"]}, -0.5, true]')
    assert reads({"anyOf": [{"type": "null"}, {"type": "integer"}]}, "null")
    assert not reads({"anyOf": [{"type": "null"}, {"type": "integer"}]}, '"x"')
    assert reads({"const": {"a": 1}}, '{"a": 1}') and not reads({"const": {"a": 1}}, '{"a": 2}')
    tree = {
        "$defs": {
            "node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}
        },
        "$ref": "#/$defs/node",
    }
    assert reads(tree, '{"next": {"next": {"next": null}}}') and not reads(tree, '{"next": 1}')
    assert reads({"$ref": "#"}, '{"a": 1}')  # a reference to itself: any value
    assert reads({"type": "object", "properties": {}}, "{}") and not reads({"type": "object", "properties": {}}, "{ }x")
    assert reads(WEATHER, '"city": "x", "unit": "celsius"}', start="{")  # after the reply's forced "{"


def small_vocab(seed: int = 0) -> tuple[list[str], Vocabulary]:
    rng = random.Random(seed)
    alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789 {}[]:,"\\\n-.eE_<>/\t'
    words = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(2500)})
    texts = ["", *words, "</tool_call>", "<|im_end|>"]
    return texts, Vocabulary(texts, [len(texts) - 2, len(texts) - 1], [len(texts) - 1])


def whole(constraint: TokenConstraint, texts: list[str], state) -> np.ndarray:
    """The mask by reading every token's text from `state` (what the walk must equal)."""
    vocab, machine = constraint.vocab, constraint.machine
    out = np.zeros(vocab.size, dtype=bool)
    for i, text in enumerate(texts):
        if i in vocab.eos:
            out[i] = machine.complete(state)
        elif i in vocab.specials:
            out[i] = bool(constraint.literal(state, text))
        elif text:
            out[i] = bool(machine.feed(state, text))
    return out


def test_masks_equal_reading_each_token_and_end_in_a_valid_call():
    """Sampled replies under the mask: every mask is exactly the tokens whose text the automaton
    reads whole (specials only as literal text, EOS only at the end), and each reply is a call
    whose arguments match the schema."""
    texts, vocab = small_vocab()
    fmt = FORMATS["hermes"].bind([{"type": "function", "function": {"name": "w", "parameters": WEATHER}}])
    constraint = TokenConstraint(automaton(reply_grammar(fmt, "w")), vocab)
    for seed in range(12):
        rng = np.random.default_rng(seed)
        processor, ids, reply = ConstrainedReply(constraint), [0, 0], ""
        for _ in range(400):
            logits = processor(ids, 3 * rng.standard_normal(vocab.size).astype(np.float32))
            mask = constraint.mask(processor.state)
            assert mask is not None and np.array_equal(mask, whole(constraint, texts, processor.state)), reply
            token = int(np.argmax(logits))
            ids.append(token)
            if token in vocab.eos:
                break
            reply += texts[token]
        assert token in vocab.eos and reply.endswith("}\n</tool_call>"), reply
        call = json.loads(fmt.forced("w").removeprefix("<tool_call>") + reply.removesuffix("</tool_call>"))
        jsonschema.validate(call["arguments"], WEATHER)


def test_string_text_fast_path_counts_maxlength():
    texts, vocab = small_vocab(1)
    machine = automaton(ReplyGrammar((("", json.dumps({"type": "string", "maxLength": 3}), ""),)))
    constraint = TokenConstraint(machine, vocab)
    state = machine.feed(machine.initial, '"ab')
    assert np.array_equal(constraint.mask(state), whole(constraint, texts, state))
    assert not any(constraint.mask(state)[i] for i, t in enumerate(texts) if t.isalpha() and len(t) > 1)


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.call is not None))
def test_call_grammars_continue_the_forced_starts(name):
    """A named call's grammar opens with the format's forced start for that name, and "required"
    offers every tool's name after the forced start for any."""
    tools = [{"type": "function", "function": {"name": n, "parameters": WEATHER}} for n in ("a_b", "c.d")]
    fmt = FORMATS[name].bind(tools)
    for tool in ("a_b", "c.d"):
        grammar = reply_grammar(fmt, tool)
        assert grammar is not None and [b[0] for b in grammar.branches] == [fmt.forced(tool)]
        assert automaton(grammar).initial
    grammar = reply_grammar(fmt, None)
    assert grammar is not None and grammar.start == fmt.forced(None)
    assert [b[0] for b in grammar.branches] == [fmt.forced("a_b"), fmt.forced("c.d")]


def test_formats_without_a_call_grammar_are_not_constrained():
    assert reply_grammar(FORMATS["mistral"], None) is None and reply_grammar(FORMATS["glm47"], "x") is None
    grammar = output_grammar(output_check({"type": "json_object"}), "{")
    assert grammar is not None and automaton(grammar).initial
    assert output_grammar(None, "") is None


def test_array_item_counts():
    """minItems / maxItems are counted (a noise model at a high temperature otherwise writes an array
    until max_tokens, and the call never closes)."""
    two_to_three = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}
    assert [reads(two_to_three, t) for t in ("[]", "[1]", "[1, 2]", "[1,2,3]", "[1, 2, 3, 4]")] == [
        False, False, True, True, False,
    ]  # fmt: skip
    assert reads({"type": "array", "maxItems": 0}, "[]") and not reads({"type": "array", "maxItems": 0}, "[1]")
    at_least_two = {"type": "array", "items": {"type": "boolean"}, "minItems": 2}
    assert not reads(at_least_two, "[true]") and reads(at_least_two, "[true, false, true, true, false]")


# the lazy grammar's vocabulary: small_vocab's words, the trigger split over two tokens, inside a
# token with the call's start after it, inside one that leaves the grammar; the markers special
LAZY_EXTRA = ("<tool", "_call>", 'ok <tool_call>\n{"na', "<tool_call>oops")
LAZY_MARKERS = ("<tool_call>", "</tool_call>", "<|im_end|>")


def lazy_setup() -> tuple[list[str], TokenConstraint, dict[str, int]]:
    words, _ = small_vocab(2)
    texts = [*words, *LAZY_EXTRA, *LAZY_MARKERS]
    n = len(texts)
    vocab = Vocabulary(texts, [n - 3, n - 2, n - 1], [n - 1])
    fmt = FORMATS["hermes"].bind([{"type": "function", "function": {"name": "w", "parameters": WEATHER}}])
    grammar = reply_grammar(fmt, None, lazy=True)
    assert grammar is not None and grammar.lazy and grammar.start == "<tool_call>"
    return texts, TokenConstraint(automaton(grammar), vocab), {t: texts.index(t) for t in (*LAZY_EXTRA, *LAZY_MARKERS)}


def test_lazy_reply_is_free_until_the_trigger_and_after_each_call():
    """Free text passes unchanged; from `<tool_call>` (a special token) the call is masked as
    "required" masks it, to a valid call; after `</tool_call>` the reply is free again, and the
    next `<tool_call>` constrains the next call."""
    texts, constraint, ids = lazy_setup()
    rng = np.random.default_rng(0)
    processor, tokens = LazyReply(constraint, "<tool_call>"), [0, 1]
    for word in range(5, 25):  # free text: the logits unchanged
        logits = rng.standard_normal(len(texts)).astype(np.float32)
        assert processor(tokens, logits) is logits and processor.state is None
        tokens.append(word)
    for call in range(2):
        tokens.append(ids["<tool_call>"])
        reply = ""
        for _ in range(400):
            logits = processor(tokens, 3 * rng.standard_normal(len(texts)).astype(np.float32))
            if processor.state is None:
                break
            assert np.array_equal(np.isfinite(logits), whole(constraint, texts, processor.state)), reply
            tokens.append(int(np.argmax(logits)))
            reply += texts[tokens[-1]]
        assert processor.state is None and reply.endswith("}\n</tool_call>"), reply
        jsonschema.validate(json.loads(reply.removesuffix("</tool_call>"))["arguments"], WEATHER)
        free = rng.standard_normal(len(texts)).astype(np.float32)
        assert processor(tokens, free) is free  # free again: EOS, text or another call
        tokens.append(7)


def test_lazy_reply_trigger_split_inside_or_leaving():
    texts, constraint, ids = lazy_setup()
    machine, logits = constraint.machine, np.zeros(len(texts), dtype=np.float32)

    def after(*pieces: str) -> LazyReply:
        processor = LazyReply(constraint, "<tool_call>")
        processor([0], logits)
        for i, piece in enumerate(pieces):
            processor([0, *(ids[p] for p in pieces[: i + 1])], logits)
        return processor

    split = after("<tool", "_call>")  # over two tokens
    assert split.state == machine.initial and not np.isfinite(split([0], logits)[ids["<|im_end|>"]])
    inside = after('ok <tool_call>\n{"na')  # with the call's start after it in the same token
    assert inside.state == machine.feed(machine.initial, '\n{"na') and inside.state
    mask = np.isfinite(inside([0], logits))
    assert np.array_equal(mask, whole(constraint, texts, inside.state))
    left = after("<tool_call>oops")  # the token already left the grammar: that call stays free
    assert left.state is None and left([0], logits) is logits
    assert after("<tool_call>oops", "<tool_call>").state == machine.initial  # the next call is constrained
    assert after("<tool", "<|im_end|>", "_call>").state is None  # not a trigger: "<tool<|im_end|>_call>"


def test_lazy_grammar_under_tool_choice_auto():
    """auto gives the lazy grammar of "required" (hermes, harmony, kimi_k2), none for llama3 (its
    opening is plain JSON) or a format without JSON arguments; required stays eager."""
    tools = [{"type": "function", "function": {"name": "w", "parameters": WEATHER}}]
    for name, lazy in (("hermes", True), ("harmony", True), ("kimi_k2", True), ("llama3", False), ("mistral", False)):
        grammar = reply_grammar(FORMATS[name].bind(tools), None, lazy=True)
        assert (grammar is not None) == lazy, name
        assert grammar is None or grammar == replace(reply_grammar(FORMATS[name].bind(tools), None), lazy=True)
    body = {"messages": [{"role": "user", "content": "x"}], "tools": tools}
    auto = chat_setup(ChatRequest.model_validate(body), "{{ tools }} <tool_call>")
    assert auto.grammar is not None and auto.grammar.lazy and auto.prefix == ""
    required = chat_setup(ChatRequest.model_validate({**body, "tool_choice": "required"}), "{{ tools }} <tool_call>")
    assert required.grammar is not None and not required.grammar.lazy
