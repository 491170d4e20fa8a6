"""A character-level automaton of JSON text that matches a JSON schema: the nodes a constrained
reply's grammar (reply_grammar.py) is built of, and what token_mask.py walks the vocabulary with.
Pure Python, no tokenizer.

The schema keywords it follows (llama.cpp's json-schema-to-grammar is the model, cut down):

- type object with `properties`: exactly those keys, each at most once, the required ones first
  and then the optional ones, both in the order of `properties` (additionalProperties false,
  whatever the schema says); a property's value by its own schema. An object without properties
  is any JSON object ("{}" only with additionalProperties false).
- string (escapes included; minLength / maxLength, counted in characters, an escape as one),
  number and integer (at most 15 digits before the point, 15 after it and 2 in the exponent:
  every number it allows is a finite double, which a JSON response can carry; 1e999 is not),
  boolean, null; a list of types; enum and const (each value as json.dumps writes it).
- array of `items` (a schema, or any JSON value; minItems / maxItems); anyOf / oneOf (one of them; oneOf's "exactly
  one" is not checked); `$ref` to "#/..." of the same schema (recursion included).
- anything else (allOf, not, if/then, patternProperties, a schema that is not an object): any JSON
  value. Not enforced either: pattern, format, numeric bounds, minItems / maxItems past MAX_UNROLLED,
  uniqueItems: a reply is still checked against the whole schema where the server checks one.

Between JSON tokens the automaton allows at most one white space character (space or new line),
which keeps its states few. A state is a frozenset of configurations (several while anyOf or a
number's end is undecided); a configuration is a tuple of frames (node, local state), the
innermost last, whose innermost frame is a terminal that can take another character; () is the
whole text done. States are hashable, so token_mask.py caches a mask per state.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

Config = tuple[tuple[Any, Any], ...]
State = frozenset[Config]
WHITE = frozenset(" \n")
DIGITS = frozenset("0123456789")
HEX = frozenset("0123456789abcdefABCDEF")
ESCAPES = frozenset('"\\/bfnrtu')
MAX_DIGITS = (15, 15, 2)  # before the point, after it, in the exponent (< 1e115: finite)
MAX_UNROLLED = 256  # minItems / maxItems enforced up to this count (one node per count); past it, not


def finish(rest: Config) -> Iterator[Config]:
    """The configurations once the innermost node of `rest`'s child is complete."""
    if not rest:
        yield ()
        return
    node, local = rest[-1]
    yield from node.resume(rest[:-1], local)


class Terminal:
    """A node that reads characters itself: feed (local, ch) -> local or None; more: it can take
    another character; final: it may end here."""

    initial: Any = 0

    def enter(self, rest: Config) -> Iterator[Config]:
        yield from self.settle(rest, self.initial)

    def settle(self, rest: Config, local: Any) -> Iterator[Config]:
        if self.more(local):
            yield (*rest, (self, local))
        if self.final(local):
            yield from finish(rest)

    def feed(self, local: Any, ch: str) -> Any:
        raise NotImplementedError

    def more(self, local: Any) -> bool:
        return True

    def final(self, local: Any) -> bool:
        return False

    def chars(self, local: Any) -> frozenset[str] | None:
        """The characters it may take next (None: too many to list)."""
        return None


class Lit(Terminal):
    """Exactly `text`."""

    def __init__(self, text: str):
        self.text = text

    def feed(self, local: int, ch: str) -> int | None:
        return local + 1 if self.text[local] == ch else None

    def more(self, local: int) -> bool:
        return local < len(self.text)

    def final(self, local: int) -> bool:
        return local == len(self.text)

    def chars(self, local: int) -> frozenset[str]:
        return frozenset(self.text[local])


class Space(Terminal):
    """At most one white space character."""

    def feed(self, local: int, ch: str) -> int | None:
        return 1 if local == 0 and ch in WHITE else None

    def more(self, local: int) -> bool:
        return local == 0

    def final(self, local: int) -> bool:
        return True

    def chars(self, local: int) -> frozenset[str]:
        return WHITE


class Str(Terminal):
    """A JSON string. local: (mode, characters so far); mode 0 before the opening quote, 1 in the
    text, 2 after a backslash, 3-6 in a \\uXXXX escape, 7 closed. The count is kept only while a
    length bound needs it (so a string without bounds stays in one state)."""

    initial = (0, 0)

    def __init__(self, least: int = 0, most: int | None = None):
        self.least, self.most = least, most
        self.counted = least > 0 or most is not None

    def _count(self, n: int) -> int:
        return n + 1 if self.counted else 0

    def feed(self, local: tuple[int, int], ch: str) -> tuple[int, int] | None:
        mode, n = local
        if mode == 0:
            return (1, 0) if ch == '"' else None
        if mode == 1:
            if ch == '"':
                return (7, n) if n >= self.least else None
            if self.most is not None and n >= self.most:
                return None
            if ch == "\\":
                return (2, n)
            return None if ch < " " else (1, self._count(n))
        if mode == 2:
            if ch not in ESCAPES:
                return None
            return (3, n) if ch == "u" else (1, self._count(n))
        if ch not in HEX:
            return None
        return (mode + 1, n) if mode < 6 else (1, self._count(n))

    def more(self, local: tuple[int, int]) -> bool:
        return local[0] != 7

    def final(self, local: tuple[int, int]) -> bool:
        return local[0] == 7

    def chars(self, local: tuple[int, int]) -> frozenset[str] | None:
        mode = local[0]
        return frozenset('"') if mode == 0 else None if mode == 1 else ESCAPES if mode == 2 else HEX

    def remaining(self, local: tuple[int, int]) -> int | None:
        """In the text: how many more characters it may take (None: any number)."""
        return None if self.most is None else self.most - local[1]


class Num(Terminal):
    """A JSON number (an integer: no fraction or exponent). local: (phase, digits in this part);
    phases 0 start, 1 after '-', 2 a leading 0, 3 integer digits, 4 after '.', 5 fraction
    digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits."""

    initial = (0, 0)

    def __init__(self, integer: bool = False):
        self.integer = integer

    def feed(self, local: tuple[int, int], ch: str) -> tuple[int, int] | None:
        phase, n = local
        digit = ch in DIGITS
        if phase in (0, 1):
            if ch == "-" and phase == 0:
                return (1, 0)
            return None if not digit else (2, 1) if ch == "0" else (3, 1)
        if phase in (2, 3, 5, 8) and digit:
            part = {2: 0, 3: 0, 5: 1, 8: 2}[phase]
            return (phase, n + 1) if phase != 2 and n < MAX_DIGITS[part] else None
        if phase in (2, 3) and not self.integer and ch in ".eE":
            return (4, 0) if ch == "." else (6, 0)
        if phase == 5 and ch in "eE":
            return (6, 0)
        if phase == 4 and digit:
            return (5, 1)
        if phase == 6 and ch in "+-":
            return (7, 0)
        if phase in (6, 7) and digit:
            return (8, 1)
        return None

    def more(self, local: tuple[int, int]) -> bool:
        return local[0] != 2 or not self.integer

    def final(self, local: tuple[int, int]) -> bool:
        return local[0] in (2, 3, 5, 8)

    def chars(self, local: tuple[int, int]) -> frozenset[str]:
        return DIGITS | frozenset("-.eE+")


class Seq:
    """The items one after the other (the last entered without a frame of its own: a tail call,
    so that an array's or an object's repetition does not grow the configuration)."""

    def __init__(self, *items: Any):
        self.items = items

    def enter(self, rest: Config) -> Iterator[Config]:
        yield from self._at(rest, 0)

    def _at(self, rest: Config, i: int) -> Iterator[Config]:
        if i == len(self.items):
            yield from finish(rest)
        elif i == len(self.items) - 1:
            yield from self.items[i].enter(rest)
        else:
            yield from self.items[i].enter((*rest, (self, i)))

    def resume(self, rest: Config, i: int) -> Iterator[Config]:
        yield from self._at(rest, i + 1)


class Alt:
    """One of the options (filled in after creation where the grammar is recursive)."""

    def __init__(self, *options: Any):
        self.options = list(options)

    def enter(self, rest: Config) -> Iterator[Config]:
        for option in self.options:
            yield from option.enter(rest)


def _repeated(open_: str, item: Any, close: str) -> Seq:
    """open, then items separated by ',' (white space around them), then close; or open close."""
    tail = Alt(Lit(close))
    tail.options.append(Seq(Lit(","), Space(), item, Space(), tail))
    return Seq(Lit(open_), Space(), Alt(Lit(close), Seq(item, Space(), tail)))


def _counted(item: Any, least: int, most: int | None) -> Seq:
    """An array of `item` with minItems `least` and maxItems `most` (None: no bound): unrolled,
    one node per count up to the larger bound, the unbounded tail shared past it."""
    made: dict[int, Any] = {}
    free = Alt(Lit("]"))  # past both bounds: any further count
    free.options.append(Seq(Lit(","), Space(), item, Space(), free))

    def after(k: int) -> Any:  # k items written
        if most is None and k >= least:
            return free
        if k not in made:
            options = [Lit("]")] if k >= least else []
            if most is None or k < most:
                options.append(Seq(Lit(","), Space(), item, Space(), after(k + 1)))
            made[k] = Alt(*options)
        return made[k]

    first = ([Lit("]")] if least == 0 else []) + ([Seq(item, Space(), after(1))] if most is None or most > 0 else [])
    return Seq(Lit("["), Space(), Alt(*first))


def _any_value() -> Alt:
    """Any JSON value."""
    value = Alt()
    member = Seq(Str(), Space(), Lit(":"), Space(), value)
    value.options += [_repeated("{", member, "}"), _repeated("[", value, "]"), Str(), Num()]
    value.options += [Lit("true"), Lit("false"), Lit("null")]
    return value


class Compiler:
    """A schema's nodes; `$ref`s resolved in the root schema (each compiled once: recursion)."""

    def __init__(self, root: Any):
        self.root = root
        self.refs: dict[str, Alt] = {}
        self.any = _any_value()

    def node(self, schema: Any) -> Any:
        if not isinstance(schema, dict):
            return self.any
        if "$ref" in schema and isinstance(schema["$ref"], str):
            return self._ref(schema["$ref"])
        if "const" in schema:
            return Lit(json.dumps(schema["const"]))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return Alt(*(Lit(json.dumps(v)) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return Alt(*(self.node(s) for s in schema[key]))
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return Alt(*(self.node({**schema, "type": k}) for k in kind))
        if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
            return self._object(schema)
        if kind == "array":
            item = self.node(schema["items"]) if "items" in schema else self.any
            least, most = schema.get("minItems", 0), schema.get("maxItems")
            least = least if isinstance(least, int) and 0 <= least <= MAX_UNROLLED else 0
            most = most if isinstance(most, int) and least <= most <= MAX_UNROLLED else None
            return _counted(item, least, most) if least or most is not None else _repeated("[", item, "]")
        if kind == "string":
            least, most = schema.get("minLength", 0), schema.get("maxLength")
            return Str(least if isinstance(least, int) else 0, most if isinstance(most, int) else None)
        if kind in ("number", "integer"):
            return Num(integer=kind == "integer")
        if kind == "boolean":
            return Alt(Lit("true"), Lit("false"))
        if kind == "null":
            return Lit("null")
        return self.any

    def _ref(self, ref: str) -> Any:
        if ref not in self.refs:
            self.refs[ref] = slot = Alt()
            target: Any = self.root if ref.startswith("#") else None
            for part in ref[1:].split("/")[1:] if target is not None else []:
                key = part.replace("~1", "/").replace("~0", "~")
                target = target.get(key) if isinstance(target, dict) else None
            slot.options.append(self.node(target))
        return self.refs[ref]

    def _object(self, schema: dict[str, Any]) -> Any:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return Lit("{}") if schema.get("additionalProperties") is False else self.any.options[0]
        required = [r for r in schema.get("required", []) if isinstance(r, str)]
        names = [n for n in properties if n in required] + [r for r in required if r not in properties]
        names += [n for n in properties if n not in required]
        pairs = [Seq(Lit(json.dumps(n)), Space(), Lit(":"), Space(), self.node(properties.get(n))) for n in names]
        need = sum(1 for n in names if n in required)
        made: dict[tuple[int, bool], Any] = {}

        def rest(i: int, after: bool) -> Any:
            """The members from the i-th on (after: one was written, so a ',' comes first)."""
            if (i, after) not in made:
                lead = (Lit(","), Space()) if after else ()
                options = range(i, i + 1) if i < need else range(i, len(names))
                members = [Seq(*lead, pairs[j], Space(), rest(j + 1, True)) for j in options]
                made[i, after] = Alt(*members, *([] if i < need else [Lit("}")]))
            return made[i, after]

        return Seq(Lit("{"), Space(), rest(0, False))


def json_value(schema: Any) -> Any:
    """The nodes of a JSON value of `schema`; any JSON value where the schema refers to itself
    before any character is read (a $ref cycle: the automaton would never settle)."""
    node = Compiler(schema).node(schema)
    try:
        frozenset(node.enter(()))
    except RecursionError:
        return _any_value()
    return node
