"""Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens) on the chat route's Plan.

A Messages body is checked field by field (a 400 in Anthropic's error shape names the field), then
translated into the OpenAI chat body the other route parses: system -> a system message, tool_use
blocks -> the assistant's tool_calls, tool_result blocks -> tool messages, tools -> function
tools, tool_choice auto / any / tool / none -> auto / required / the named function / none
(disable_parallel_tool_use -> parallel_tool_calls false), stop_sequences -> stop, output_config's
format -> response_format json_schema (validated, as there). From there both
routes are one path: chat.py renders the template and plan.py builds the Plan. specfill's own
fields (method, keep_ratio, ...) travel in `metadata` or as extra top-level fields.

The reply is read by the same Reply and shaped by anthropic_shape.MessageShape. An earlier turn's
thinking blocks (their text, or the text our signature hides: anthropic_shape.signed) become its
reasoning_content, which the chat template renders or drops as it was written to (Qwen3's keeps the
reasoning of the turns since the last user message, as the model wrote it: the prompt cache then finds
them); redacted_thinking blocks are dropped; images and documents are a 400.
An omitted temperature is the server's default (greedy), not Anthropic's 1.0.

What Claude Code sends (issue 46) is accepted: the beta query (ignored), `thinking` (disabled: thinking off) and
`context_management` (ignored), system-role messages inside `messages` and its attribution line
(system_turns.py says where they go and why).
"""

from __future__ import annotations

import json
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .anthropic_shape import signed
from .chat import ChatSetup, chat_prompt, chat_setup, check_schema, check_tool_name, unknown_field
from .errors import anthropic_error_body, bad_request
from .info import check_model
from .plan import ServerDefaults
from .protocol import ChatRequest, SpecfillFields, parse_data, read_json
from .system_turns import inline_system_in_place, join, place_inline_system, system_text, text_of

NUMBER = Union[int, float]
error_body = anthropic_error_body
# a custom tool's documented fields; all but the first four are accepted and ignored (the prompt cache is
# automatic, Hermes inputs stream as written (others whole), every tool is rendered, nothing runs tools
# server-side)
TOOL_FIELDS = frozenset(
    {
        "name",
        "description",
        "input_schema",
        "type",
        "cache_control",
        "eager_input_streaming",
        "strict",
        "defer_loading",
        "input_examples",
        "allowed_callers",
    }
)
CHOICE_FIELDS = frozenset({"type", "name", "disable_parallel_tool_use"})
SPECFILL_FIELDS = (*SpecfillFields.model_fields, "chat_template_kwargs", "reasoning_format")  # the chat route's
DROPPED_BLOCKS = frozenset({"redacted_thinking"})


class MessagesRequest(BaseModel):
    """The fields specfill reads; others (service_tier, container, ...) are ignored, as on the OpenAI route."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)  # required on /v1/messages, not for counting
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: NUMBER | None = None  # ranges: SamplingConfig's checks, on the chat request
    top_p: NUMBER | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None  # user_id is ignored; specfill's own fields are read from it
    output_config: dict[str, Any] | None = None  # format: response_format; effort: reasoning_effort
    thinking: dict[str, Any] | None = None  # {"type": "disabled"}: reasoning_effort "none" (reasoning.py)
    context_management: dict[str, Any] | None = None  # server-side context editing: ignored (nothing is cleared)


def _validated(data: dict[str, Any], counting: bool) -> MessagesRequest:
    try:
        request = MessagesRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}"
            for p in first["loc"]
            if not (isinstance(p, str) and (p in ("int", "float", "str", "bool") or "[" in p))
        )
        where = where.lstrip(".") or "body"
        raise bad_request(f"invalid field '{where}': {first['msg']}", where) from None
    if request.max_tokens is None and not counting:
        raise bad_request("missing field 'max_tokens': Messages requests must set it", "max_tokens")
    return request


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    """An assistant turn: its text, its thinking blocks as reasoning_content (the template decides
    what to render of it) and its tool_use blocks as tool_calls."""
    texts, thoughts, calls = [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            if thought := block["thinking"] or signed(block.get("signature")):  # shown, or hidden in our signature
                thoughts.append(thought)
        elif kind == "tool_use":
            if not isinstance(block.get("input"), dict) or not isinstance(block.get("id"), str):
                raise bad_request(f"'{where}[{j}]': a tool_use block needs an id, a name and an input object", where)
            name = check_tool_name(block.get("name"), f"{where}[{j}].name")
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(block["input"], ensure_ascii=False)},
                }
            )
        elif kind not in DROPPED_BLOCKS:
            raise bad_request(
                f"'{where}[{j}]': content of type {kind!r} is not supported in an assistant turn (text, tool_use)",
                where,
            )
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if thoughts:
        message["reasoning_content"] = "\n\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[Any], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: each tool_result a tool message (in order), text blocks user messages between them."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
            texts.clear()

    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            flush()
            call = block.get("tool_use_id")
            if not isinstance(call, str):
                raise bad_request(f"'{where}[{j}].tool_use_id' must be the id of a tool_use block", where)
            content = text_of(block.get("content", ""), f"{where}[{j}].content")
            message = {"role": "tool", "content": content, "tool_call_id": call}
            if call in names:
                message["name"] = names[call]
            out.append(message)
        else:
            raise bad_request(
                f"'{where}[{j}]': content of type {kind!r} is not supported in a user turn (text, tool_result)", where
            )
    flush()
    return out


def _messages(request: MessagesRequest, inline_system: bool = True) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages (system first). System messages inside `messages`:
    leading ones join the system prompt; later ones stay system messages where they are
    (inline_system, with a system prompt) or are folded into a neighbouring user turn
    (system_turns.place_inline_system)."""
    system = [system_text(request.system, "system")] if request.system else []
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> tool name, for the tool messages that answer it
    for i, message in enumerate(request.messages):
        where = f"messages[{i}]"
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant", "system"):
            raise bad_request(
                f'\'{where}.role\' must be "user", "assistant" or "system", got {role!r}', f"{where}.role"
            )
        if role == "system":
            text = system_text(content, f"{where}.content")
            if out and text:
                out.append({"role": "system", "content": text})
            elif text:
                system.append(text)
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"'{where}.content' must be a string or a list of content blocks", f"{where}.content")
        if role == "assistant":
            turn = _assistant(content, f"{where}.content")
            names.update({c["id"]: c["function"]["name"] for c in turn.get("tool_calls", [])})
            out.append(turn)
        else:
            out.extend(_user(content, f"{where}.content", names))
    head = join(*system)
    if not (inline_system and head):  # no system prompt: some templates put the first system turn's text first
        out = place_inline_system(out)
    return ([{"role": "system", "content": head}] if head else []) + out


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Custom tools as OpenAI function tools (server tools, e.g. web_search, are a 400)."""
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"'{where}' must be an object", where)
        if tool.get("type", "custom") != "custom":
            raise bad_request(f"'{where}.type': only custom tools are supported, got {tool['type']!r}", f"{where}.type")
        unknown_field(tool, TOOL_FIELDS, where)
        name = check_tool_name(tool.get("name"), f"{where}.name")
        schema = check_schema(tool.get("input_schema"), f"{where}.input_schema")
        function = {"name": name, "parameters": schema}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise bad_request(f"'{where}.description' must be a string", f"{where}.description")
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict[str, Any]) -> tuple[Any, bool]:
    """(OpenAI's tool_choice, parallel_tool_calls)."""
    unknown_field(choice, CHOICE_FIELDS, "tool_choice")
    kind = choice.get("type")
    serial = choice.get("disable_parallel_tool_use", False)
    if not isinstance(serial, bool):
        raise bad_request("'tool_choice.disable_parallel_tool_use' must be true or false", "tool_choice")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, not serial
    if kind in ("auto", "none"):
        return kind, not serial
    if kind == "any":
        return "required", not serial
    raise bad_request(f"'tool_choice.type' must be auto, any, tool or none, got {kind!r}", "tool_choice.type")


def chat_body(request: MessagesRequest, inline_system: bool = True) -> dict[str, Any]:
    """The OpenAI chat body a Messages request stands for (specfill's fields from metadata, then
    the top level); inline_system: whether system messages past the first turn stay in place."""
    body: dict[str, Any] = {"messages": _messages(request, inline_system), "stream": request.stream}
    for name in ("model", "max_tokens", "temperature", "top_p", "top_k"):
        if getattr(request, name) is not None:
            body[name] = getattr(request, name)
    if request.stop_sequences:
        body["stop"] = list(request.stop_sequences)
    if request.tools:
        body["tools"] = _tools(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"], parallel = _tool_choice(request.tool_choice)
        if not parallel:
            body["parallel_tool_calls"] = False
    form = (request.output_config or {}).get("format")
    if form is not None:
        if not isinstance(form, dict) or form.get("type") != "json_schema":
            raise bad_request(
                '\'output_config.format\' must be {"type": "json_schema", "schema": {...}}', "output_config.format"
            )
        unknown_field(form, frozenset({"type", "schema"}), "output_config.format")
        schema = check_schema(form.get("schema"), "output_config.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    if (effort := _effort(request)) is not None:
        body["reasoning_effort"] = effort
    extra = {**(request.metadata or {}), **(request.model_extra or {})}
    body.update({name: extra[name] for name in SPECFILL_FIELDS if name in extra})
    return body


# output_config.effort (Claude Code sends "high"; "xhigh" and "max" for its strongest setting)
ANTHROPIC_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}


def _effort(request: MessagesRequest) -> str | None:
    """The chat route's reasoning_effort: "none" for thinking disabled, else output_config.effort's (None:
    the template's default; Claude Code asks adaptive thinking by default). An effort this server does
    not know is a hint it leaves to the template's default (a newer client's level must not fail the
    request); one that is not a string is a 400."""
    thinking = request.thinking if isinstance(request.thinking, dict) else {}
    if thinking.get("type") == "disabled":
        return "none"
    effort = (request.output_config or {}).get("effort")
    if effort is not None and not isinstance(effort, str):
        raise bad_request(f"'output_config.effort' must be a string, got {effort!r}", "output_config.effort")
    return ANTHROPIC_EFFORTS.get(effort) if effort is not None else None


def prepare(
    raw: bytes, tokenizer: Any, defaults: ServerDefaults, *, counting: bool = False
) -> tuple[ChatRequest, ChatSetup, list[int], bool]:
    """A Messages body -> (the chat request it stands for, its setup, the prompt ids, whether the reply's
    thinking is shown: `thinking.display` "omitted" hides it); a 400 / 404 (RequestError) names the field.
    counting: /count_tokens (max_tokens may be left out)."""
    request = _validated(read_json(raw), counting)
    check_model(request.model, defaults)
    chat = parse_data(chat_body(request, inline_system_in_place(tokenizer)), ChatRequest)
    setup = chat_setup(chat, tokenizer.chat_template, defaults.chat_template_kwargs)
    ids, setup = chat_prompt(tokenizer, chat, setup)
    return chat, setup, ids, (request.thinking or {}).get("display") != "omitted"
