"""The system prompt of an Anthropic Messages request: its `system` field, the system-role
messages inside `messages`, and Claude Code's attribution line (issue 46).

What Claude Code sends: its requests go to /v1/messages?beta=true (the query is ignored); `thinking`
and `context_management` are accepted and ignored (no thinking blocks come back; the conversation is
not edited server-side, so the prompt cache keeps it whole), `metadata.user_id` and
`output_config.effort` likewise (anthropic.py). Its first system block, the per-version attribution
line (`x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=...;`), is dropped
(chat.without_billing_header): it would end the prompt cache's shared prefix at its first tokens.

A `system`-role message inside `messages`: those before the first user or assistant message join the
system prompt; a later one stays where it is, as a system turn, when the request has a system prompt
and the model's chat template renders a system turn there (inline_system_in_place probes the template
once), else its text joins the neighbouring user turn (place_inline_system: the end of the user or
tool message before it; after an assistant turn, the start of the next user message, or a user
message of its own). Either way a system message an agent appends at the end of a turn changes only
the end of the prompt: moving it up into the system prompt would change the prompt's head every turn
and the prompt cache could reuse nothing (vLLM's entrypoints/anthropic/inline_system.py decides the
same way, and folds too when the request has no system prompt).
"""

from __future__ import annotations

from typing import Any, Mapping

from .chat import without_billing_header
from .errors import bad_request

MESSAGES_TEXT = {"text": "text"}  # an Anthropic content block type -> the key of its text


def text_of(blocks: Any, where: str, fields: Mapping[str, str] = MESSAGES_TEXT, noun: str = "blocks") -> str:
    """A string, or text blocks joined (other block types are a 400 naming the block). fields: each
    block type taken, and the key that holds its text (Anthropic's text blocks; the Responses API's
    parts: openai_responses.RESPONSES_TEXT); noun: what the API calls them."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"'{where}' must be a string or a list of content {noun}", where)
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if not isinstance(block, dict) or not isinstance(kind, str) or kind not in fields:
            raise bad_request(f"'{where}[{j}]': content of type {kind!r} is not supported (text only)", f"{where}[{j}]")
        key = fields[kind]
        if not isinstance(block.get(key), str):
            raise bad_request(f"'{where}[{j}].{key}' must be a string", f"{where}[{j}].{key}")
        texts.append(block[key])
    return "\n\n".join(texts)


def system_text(blocks: Any, where: str) -> str:
    """A system prompt's text (text_of) without Claude Code's attribution line; a block left empty
    is left out, separator and all."""
    if isinstance(blocks, list):
        text_of(blocks, where)  # the same 400 for a block that is not text
        return join(*(without_billing_header(b["text"]) for b in blocks))
    return without_billing_header(text_of(blocks, where))


def join(*texts: str) -> str:
    return "\n\n".join(t for t in texts if t)


def place_inline_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages with each system message's text folded into a neighbouring user turn, for
    a template that renders no system turn past the first: at the end of the user (or tool) message
    before it; after an assistant turn, at the start of the next user message (or at the end of the
    tool results that answer the assistant's calls), else a user message of its own. Only the
    conversation's end changes as it grows, so a conversation's next request extends its last prompt."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # system text after an assistant turn, not placed yet
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "system":
            if not message["content"]:
                continue
            if out and out[-1]["role"] in ("user", "tool") and not pending:
                out[-1] = {**out[-1], "content": join(out[-1]["content"], message["content"])}
            else:
                pending.append(message["content"])
            continue
        if pending and role == "user":
            message = {**message, "content": join(*pending, message["content"])}
            pending = []
        elif pending and role == "assistant":
            out.append({"role": "user", "content": join(*pending)})
            pending = []
        elif pending and role == "tool" and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool"):
            message = {**message, "content": join(message["content"], *pending)}  # the last result of the run
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": join(*pending)})
    return out


_PROBE = "Zulu inline system note"
_IN_PLACE: dict[str, bool] = {}  # chat template -> whether it renders a later system message in place


def inline_system_in_place(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a system message after the first user turn
    where it stands: rendering it neither fails nor drops it, and leaves what comes before it as it
    was, both between two turns and at the end. Probed once per template."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    if template not in _IN_PLACE:
        first = [{"role": "system", "content": "Alpha rules"}, {"role": "user", "content": "Bravo question"}]
        note = {"role": "system", "content": _PROBE}
        later = [{"role": "assistant", "content": "Charlie answer"}, {"role": "user", "content": "Delta question"}]
        try:
            head = tokenizer.apply_chat_template(first, add_generation_prompt=False)
            cases = [
                tokenizer.apply_chat_template([*first, note, *later], add_generation_prompt=True),
                tokenizer.apply_chat_template([*first, note], add_generation_prompt=True),
            ]
        except Exception:  # noqa: BLE001 - a template that refuses it (raise_exception) or fails on it
            _IN_PLACE[template] = False
        else:
            _IN_PLACE[template] = all(c.startswith(head) and _PROBE in c[len(head) :] for c in cases)
    return _IN_PLACE[template]
