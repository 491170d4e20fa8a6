"""What a constrained reply is (ReplyGrammar) and its character automaton (Automaton), built of
json_grammar.py's nodes: literal text, then the arguments, then literal text.

The arguments are a JSON value of a schema (a call's arguments where the format writes them as
JSON: hermes, llama3, harmony, kimi_k2; a JSON response_format), or, for Qwen3.5 / Qwen3.6 /
Qwen3-Coder's XML calls (`arguments="xml"`), one `<parameter=NAME>\\nVALUE\\n</parameter>\\n`
block per parameter of the function's schema, as its chat template teaches:

- the parameters in the order of `properties`, each at most once, the required ones always, the
  optional ones maybe (properties outside the schema never); a required name without a schema
  last, as text;
- a value as the format's reader types it from the schema (mlx-lm's qwen3_coder parser, or
  tool_parsers' own): text for string types (anything up to the first `\\n</parameter>`, at
  most maxLength characters; an enum or const of strings: one of them), a JSON number for number
  and integer, true or false for boolean, null for null, the JSON of the schema (json_grammar's
  keywords) for object and array, one of the options for anyOf / oneOf; anything else (no type, a
  list of types, a $ref) text, which the reader reads as it reads any text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .json_grammar import Alt, Compiler, Lit, Num, Seq, State, Str, Terminal, json_value

XML_END = "\n</parameter>"  # what ends a Qwen3-Coder parameter's value (the reader cuts one new line each side)
ARGUMENTS = ("json", "xml")  # ReplyGrammar.arguments


class RawText(Terminal):
    """Any text up to and including the first `end` (a parameter's value and its closing tag), of
    at most `most` characters before it (None: any number). local: (how many of `end`'s characters
    the text ends with, the characters before those); `end` starts with a character it has nowhere
    else, so a mismatch falls back to 0, or to 1 on that character."""

    initial = (0, 0)

    def __init__(self, end: str, most: int | None = None):
        self.end, self.most = end, most

    def feed(self, local: tuple[int, int], ch: str) -> tuple[int, int] | None:
        matched, n = local
        if self.end[matched] == ch:
            return matched + 1, n
        n += matched + (ch != self.end[0])  # what looked like the end is text, and so is ch unless it starts one
        return None if self.most is not None and n > self.most else (int(ch == self.end[0]), n)

    def more(self, local: tuple[int, int]) -> bool:
        return local[0] < len(self.end)

    def final(self, local: tuple[int, int]) -> bool:
        return local[0] == len(self.end)

    def remaining(self, local: tuple[int, int]) -> int | None:
        """With none of `end` written: how many more characters it may take (None: any number)."""
        return None if self.most is None else self.most - local[1]


def _xml_value(compiler: Compiler, schema: Any) -> Any:
    """One parameter's value and its closing tag, by its schema (the module's list)."""
    closing = Lit(XML_END + "\n")
    schema = schema if isinstance(schema, dict) else {}  # no schema: text
    options = next((schema[k] for k in ("anyOf", "oneOf") if isinstance(schema.get(k), list) and schema[k]), None)
    if options is not None:
        return Alt(*(_xml_value(compiler, option) for option in options))
    kind = schema.get("type")
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if kind in (None, "string") and isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return Seq(Alt(*(Lit(v) for v in values)), closing)
    if kind in ("number", "integer"):
        return Seq(Num(integer=kind == "integer"), closing)
    if kind == "boolean":
        return Seq(Alt(Lit("true"), Lit("false")), closing)
    if kind == "null":
        return Seq(Lit("null"), closing)
    if kind in ("object", "array") or (kind is None and isinstance(schema.get("properties"), dict)):
        return Seq(compiler.node(schema), closing)
    most = schema.get("maxLength") if kind == "string" else None
    return Seq(RawText(XML_END, most if isinstance(most, int) and most >= 0 else None), Lit("\n"))


def xml_parameters(schema: Any) -> Any:
    """A function's parameters as Qwen3-Coder's <parameter=...> blocks (the module's rules)."""
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = {r for r in schema.get("required", []) if isinstance(r, str)}
    names = [*properties, *sorted(required - set(properties))]
    compiler = Compiler(schema)
    blocks = [Seq(Lit(f"<parameter={n}>\n"), _xml_value(compiler, properties.get(n))) for n in names]
    made: dict[int, Any] = {}

    def rest(i: int) -> Any:
        """The blocks from the i-th on: any one up to the next required one, or none past it."""
        if i not in made:
            upto = next((j for j in range(i, len(names)) if names[j] in required), None)
            last = len(names) if upto is None else upto + 1
            options: list[Any] = [Seq(blocks[j], rest(j + 1)) for j in range(i, last)]
            made[i] = Alt(*options, *([Lit("")] if upto is None else []))
        return made[i]

    return rest(0)


@dataclass(frozen=True)
class ReplyGrammar:
    """What a constrained reply is: one of `branches`, each literal text, the arguments of a JSON
    schema (its JSON text; "" for none) and literal text, of which `start` (the reply's start,
    already in the prompt) has been written. arguments: "json" (a JSON value of the schema) or
    "xml" (Qwen3-Coder's parameter blocks for the schema). lazy: the reply is free until `start`
    appears in it (a call's opening, tool_choice auto), constrained from there, free again after
    each complete branch (token_mask.LazyReply). Hashable and small: a Plan carries it to every rank."""

    branches: tuple[tuple[str, str, str], ...]
    start: str = ""
    lazy: bool = False
    arguments: str = "json"

    def __post_init__(self) -> None:
        if self.arguments not in ARGUMENTS:
            raise ValueError(f"ReplyGrammar.arguments must be one of {ARGUMENTS}, got {self.arguments!r}")


class Automaton:
    """A ReplyGrammar's states: initial (after `start`; empty when `start` does not fit), step."""

    def __init__(self, grammar: ReplyGrammar):
        options = []
        for before, schema, after in grammar.branches:
            if grammar.arguments == "xml":
                value = xml_parameters(json.loads(schema) if schema else {})
            else:
                value = json_value(json.loads(schema)) if schema else Lit("")
            options.append(Seq(Lit(before), value, Lit(after)))
        self.initial = self.feed(frozenset(Alt(*options).enter(())), grammar.start)

    @staticmethod
    def step(state: State, ch: str) -> State:
        out: set[Any] = set()
        for config in state:
            if config:
                node, local = config[-1]
                following = node.feed(local, ch)
                if following is not None:
                    out.update(node.settle(config[:-1], following))
        return frozenset(out)

    def feed(self, state: State, text: str) -> State:
        for ch in text:
            if not state:
                break
            state = self.step(state, ch)
        return state

    @staticmethod
    def complete(state: State) -> bool:
        return () in state

    @staticmethod
    def chars(state: State) -> frozenset[str] | None:
        """The characters some configuration can take next (None: too many to list)."""
        out: set[str] = set()
        for config in state:
            if config:
                node, local = config[-1]
                more = node.chars(local)
                if more is None:
                    return None
                out |= more
        return frozenset(out)

    @staticmethod
    def in_text(state: State) -> tuple[str | None, int | None]:
        """Where the state is free text alone, which: ("json", how many more characters it may
        take, None: any) in one JSON string's text; ("xml", the same) in a parameter's text with
        no part of its closing tag written; (None, None) elsewhere."""
        if len(state) != 1:
            return None, None
        (config,) = state
        if not config:
            return None, None
        node, local = config[-1]
        if isinstance(node, Str) and local[0] == 1:
            return "json", node.remaining(local)
        if isinstance(node, RawText) and local[0] == 0:
            return "xml", node.remaining(local)
        return None, None


@lru_cache(maxsize=64)
def automaton(grammar: ReplyGrammar) -> Automaton:
    """The compiled automaton of a grammar (the same grammar, the same object: its masks are cached)."""
    return Automaton(grammar)
