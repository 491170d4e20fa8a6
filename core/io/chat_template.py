"""Render a model's Jinja chat template in a sandbox, with the helpers transformers provides.

Templates ship inside model files, so they run in jinja2's ImmutableSandboxedEnvironment: no
attribute access to Python internals, no mutation of the messages passed in.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Mapping, Sequence

from ..errors import ChatTemplateError


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template rejected the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters; templates expect plain JSON
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


MAX_REPEAT = 1_000_000  # characters or items one `*` may build; the exponent of `**` is bounded too


def _bounded_environment() -> type:
    """jinja2's immutable sandbox, plus limits on `*` and `**`: a template from a model file could
    otherwise ask for "x" * 10**10 or 10 ** 10 ** 10 and take the machine's memory or time."""
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, int) and abs(right) > 64:
                raise SecurityError(f"exponent {right} is too large")
            if operator == "*":
                sized, count = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(sized, (str, list, tuple)) and isinstance(count, int) and len(sized) * count > MAX_REPEAT:
                    raise SecurityError(f"repetition to {len(sized) * count} items is too large")
            return super().call_binop(context, operator, left, right)

    return BoundedEnvironment


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    """A compiled template (cached: one model renders the same template many times)."""
    import jinja2
    from jinja2.ext import loopcontrols

    _BoundedEnvironment = _bounded_environment()
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(
            f"the model's chat template is invalid Jinja (line {err.lineno}: {err.message})"
        ) from None
    except RecursionError:
        raise ChatTemplateError("the model's chat template is nested too deeply") from None


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: Mapping[str, str | None],
    **extra: Any,
) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
    import jinja2

    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ChatTemplateError(f"message {i} is not a mapping with a 'role' key: {message!r}")
    template = compile_template(source)
    try:
        return template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **dict(special_tokens),
            **extra,
        )
    except jinja2.exceptions.SecurityError as err:
        raise ChatTemplateError(f"chat template tried an unsafe operation: {err}") from None
    except (
        jinja2.TemplateError,
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ArithmeticError,
        RecursionError,
    ) as err:
        raise ChatTemplateError(f"chat template failed to render: {type(err).__name__}: {err}"[:300]) from None
