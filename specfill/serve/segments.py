"""Protected spans (issue 46 item 2): the chat template's segments SpecPrefill never drops, named by
a request's `protect` field, as prompt token spans (SpecPrefillConfig.protected).

  system     the leading system (or developer) messages' turn, with whatever the template renders
             inside it (Qwen's and Hermes' tool definitions)
  tools      the tokens the request's tools add to the prompt, wherever the template puts them
             (the prompt against its rendering without tools: the span between their common prefix
             and common suffix)
  last_user  the latest user message's turn

A request that declares tools and no `protect` protects all three (an agent's request: its system
prompt, tool schemas and question are what it acts on; Claude Code's first turn with its tool schemas
cut to 15% called a tool that did not fit: results/agent_session/real_agents/real_agents.md, run 3);
one without tools protects none (a long document usually sits in the latest user message); `protect:
[]` protects none either way.

Boundaries come from the template itself: the prompt rendered over messages[:i] (no generation
prompt) and tokenized as the prompt is shares its first b(i) tokens with the prompt; message i spans
[b(i), b(i + 1)). A boundary inside a token that re-tokenizes across the join moves to the start of
that token, so a span starts at most one token early. A segment the template cannot render on its
own (a template that refuses a partial conversation) is left unprotected, with a note.
"""

from __future__ import annotations

from typing import Any

from specfill.api import encode_prompt

from .chat import ChatSetup, answer_start, template_messages

SEGMENTS = ("system", "tools", "last_user")


def _shared(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def protected_spans(
    tokenizer: Any, request: Any, setup: ChatSetup, ids: list[int], notes: list[str] | None = None
) -> tuple[tuple[int, int], ...]:
    """The spans of `ids` (the request's prompt) its `protect` segments cover, in order (none asked: ();
    not given: every segment where the request declares tools, else none)."""
    given = getattr(request, "protect", None)
    asked = list(given if given is not None else (SEGMENTS if setup.tools else ()))
    if not asked:
        return ()
    messages = template_messages(request.messages)
    tools = {"tools": [dict(t) for t in setup.tools]} if setup.tools else {}

    def tokens(msgs: list[dict[str, Any]], with_tools: bool = True, end: bool = False) -> list[int]:
        extra = {**setup.template_kwargs, **(tools if with_tools else {})}
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=end, **extra)
        return encode_prompt(tokenizer, text + (answer_start(setup, text)[0] if end else ""))

    def boundary(i: int) -> int:
        return 0 if i == 0 else _shared(tokens(messages[:i]), ids)

    spans: list[tuple[int, int]] = []
    for name in dict.fromkeys(asked):
        try:
            if name == "system":
                lead = next(
                    (i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")), len(messages)
                )
                if lead:
                    spans.append((0, boundary(lead)))
            elif name == "tools" and tools:
                bare = tokens(messages, with_tools=False, end=True)
                start = _shared(ids, bare)
                tail = _shared(ids[start:][::-1], bare[start:][::-1])
                spans.append((start, len(ids) - tail))
            elif name == "last_user":
                last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
                if last is not None:
                    spans.append((boundary(last), boundary(last + 1)))
        except Exception as err:  # noqa: BLE001 - a template that refuses a partial conversation
            if notes is not None:
                notes.append(f"protect: the {name} segment is not protected (the chat template: {err})")
    return tuple((a, b) for a, b in spans if b > a)
