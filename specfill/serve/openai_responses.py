"""OpenAI's Responses API (POST /v1/responses, what Codex CLI speaks) on the chat route's Plan.

A Responses body is checked field by field (a 400 in OpenAI's error shape, `param` naming the
field), then translated into the chat body /v1/chat/completions parses, as the Anthropic route
does: `instructions` and the leading system / developer messages of `input` -> one system message
(a later one -> a system message where it stands), user / assistant messages (`input_text`,
`output_text`, `refusal` parts) -> chat messages, `function_call` items -> the assistant's
tool_calls (joining the assistant message before them), `function_call_output` items -> tool
messages, a `reasoning` item's `reasoning_text` parts -> the reasoning_content of the assistant turn
after it (the chat template renders or drops it: chat.py; summaries and encrypted content dropped); function
tools -> chat function tools, other tool types (web_search, file_search, local_shell, custom, mcp,
...) ignored and listed in the response's `specfill.ignored_tools` (Codex always sends some; a
tool_choice naming one is a 400); `tool_choice`, `parallel_tool_calls`, `max_output_tokens` ->
max_tokens, `temperature`, `top_p`, `text.format` -> response_format (validated, not constrained,
as there). specfill's own fields (method, keep_ratio, ...) and its sampling fields (top_k, seed,
...) sit at the top level (`extra_body` in the openai client) and pass through unchanged, so the
chat route's parsing checks them. From there both routes are one path: chat.py renders the
template and plan.py builds the Plan.

Nothing is stored server-side (`store` is accepted; the response says `store: false`):
`previous_response_id`, `conversation`, `background`, `prompt` (a stored prompt), `max_tool_calls`
and `item_reference` input items are a 400 naming the field; send the whole conversation in `input`
(the prompt cache makes that cost only its new part). `reasoning`, `include`, `truncation`,
`service_tier`, `user`, `safety_identifier`, `prompt_cache_key`, `client_metadata`, `stream_options`
and other fields are ignored. The Response object and its events: openai_responses_shape.py.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .chat import ChatSetup, chat_prompt, chat_setup, check_schema, check_tool_name, unknown_field
from .errors import bad_request
from .info import check_model
from .plan import ServerDefaults
from .protocol import ChatRequest, SamplingSettings, SpecfillFields, _is_type_tag, parse_data, read_json
from .reasoning import EFFORTS
from .system_turns import text_of

NUMBER = Union[int, float]
# a function tool's documented fields; allowed_callers, defer_loading and output_schema are accepted and
# ignored (every tool is rendered, nothing calls tools server-side, the output is the tool's own business)
FUNCTION_FIELDS = frozenset(
    {"type", "name", "description", "parameters", "strict", "allowed_callers", "defer_loading", "output_schema"}
)
ROLES = ("user", "assistant", "system", "developer")
RESPONSES_TEXT = {"input_text": "text", "output_text": "text", "refusal": "refusal"}  # a part type -> its text
# top-level fields that pass through to the chat request as they are (its parsing checks them);
# top_logprobs is there so that the chat route refuses it by name
PASSED = (
    *SpecfillFields.model_fields,
    "chat_template_kwargs",
    "reasoning_format",
    *(f for f in SamplingSettings.model_fields if f not in ("temperature", "top_p")),
)
PASSED_THROUGH = tuple(dict.fromkeys((*PASSED, "top_logprobs")))
# Responses features that need state specfill does not keep, refused by name: (field, used?, why)
UNSUPPORTED = (
    ("previous_response_id", lambda v: v is not None, "specfill stores no responses; send the whole conversation"),
    ("conversation", lambda v: v is not None, "specfill stores no conversations; send the whole conversation"),
    ("background", lambda v: v is True, "background responses are not supported"),
    ("prompt", lambda v: v is not None, "stored prompts are not supported; send instructions and input"),
    ("max_tool_calls", lambda v: v is not None, "send parallel_tool_calls false for at most one call"),
)


class ResponsesRequest(BaseModel):
    """The fields specfill reads; others are ignored, as on the OpenAI chat route."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: NUMBER | None = None  # ranges: SamplingConfig's checks, on the chat request
    top_p: NUMBER | None = None
    store: bool | None = None  # accepted: nothing is stored either way
    metadata: dict[str, Any] | None = None  # echoed in the response
    reasoning: dict[str, Any] | None = None  # effort: the chat route's reasoning_effort; summary: ignored
    text: dict[str, Any] | None = None  # its format is response_format; verbosity is ignored


def _validated(data: dict[str, Any]) -> ResponsesRequest:
    try:
        request = ResponsesRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"] if not _is_type_tag(p))
        where = where.lstrip(".") or "body"
        raise bad_request(f"invalid field '{where}': {first['msg']}", where) from None
    extra = request.model_extra or {}
    for name, used, why in UNSUPPORTED:
        if used(extra.get(name)):
            raise bad_request(f"'{name}' is not supported by specfill serve: {why}", name)
    return request


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A function_call item as an assistant's tool call (its arguments string as it is)."""
    for key in ("call_id", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"'{where}.{key}' must be a string", f"{where}.{key}")
    name = check_tool_name(item.get("name"), f"{where}.name")
    return {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages: instructions and the leading system / developer messages
    as one system message first (templates want one, first), then the items in order."""
    items: list[Any] = [{"role": "user", "content": request.input}] if isinstance(request.input, str) else request.input
    system = [request.instructions] if request.instructions else []
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id -> tool name, for the tool messages that answer it
    thoughts: list[str] = []  # reasoning items' text, for the next assistant turn

    def assistant(message: dict[str, Any]) -> dict[str, Any]:
        if thoughts:
            message["reasoning_content"] = "\n\n".join(thoughts)
            thoughts.clear()
        return message

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"'{where}' must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
            text = text_of(item.get("content"), f"{where}.content", RESPONSES_TEXT, "parts")
            if role in ("system", "developer"):
                if not out:
                    system.append(text)
                else:
                    out.append({"role": "system", "content": text})
            elif role == "assistant":
                out.append(assistant({"role": role, "content": text}))
            else:
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            call = _call(item, where)
            names[call["id"]] = call["function"]["name"]
            if out and out[-1]["role"] == "assistant" and not thoughts:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append(assistant({"role": "assistant", "content": "", "tool_calls": [call]}))
        elif kind == "reasoning":
            parts = item.get("content") or []
            if not isinstance(parts, list):
                raise bad_request(f"'{where}.content' must be a list of reasoning_text parts", f"{where}.content")
            thoughts.extend(
                p["text"]
                for p in parts
                if isinstance(p, dict) and p.get("type") == "reasoning_text" and isinstance(p.get("text"), str)
            )
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"'{where}.call_id' must be the call_id of a function_call", f"{where}.call_id")
            message = {
                "role": "tool",
                "content": text_of(item.get("output"), f"{where}.output", RESPONSES_TEXT, "parts"),
                "tool_call_id": call_id,
            }
            if call_id in names:
                message["name"] = names[call_id]
            out.append(message)
        else:
            raise bad_request(
                f"'{where}.type': input items of type {kind!r} are not supported "
                "(message, function_call, function_call_output, reasoning)",
                f"{where}.type",
            )
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    if not any(m["role"] != "system" for m in out):
        raise bad_request("'input' has no user, assistant or tool turn", "input")
    return out


def _tools(tools: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(function tools as chat tools, the tools ignored as 'tools[i] (type)')."""
    out, ignored = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise bad_request(f"'{where}' must be an object with a type", where)
        if tool["type"] != "function":
            ignored.append(f"{where} ({tool['type']})")
            continue
        unknown_field(tool, FUNCTION_FIELDS, where)
        function: dict[str, Any] = {"name": check_tool_name(tool.get("name"), f"{where}.name")}
        if tool.get("description") is not None:
            if not isinstance(tool["description"], str):
                raise bad_request(f"'{where}.description' must be a string", f"{where}.description")
            function["description"] = tool["description"]
        if tool.get("parameters") is not None:
            function["parameters"] = check_schema(tool["parameters"], f"{where}.parameters")
        if tool.get("strict") is not None:
            if not isinstance(tool["strict"], bool):
                raise bad_request(f"'{where}.strict' must be true or false", f"{where}.strict")
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out, ignored


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    """The chat route's tool_choice (auto, none, required or a named function)."""
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request(
                f"'tool_choice' must be auto, none, required or a function, got {choice!r}", "tool_choice"
            )
        return choice
    if choice.get("type") != "function":
        raise bad_request(
            f"'tool_choice.type': only function tools can be chosen, got {choice.get('type')!r}", "tool_choice.type"
        )
    unknown_field(choice, frozenset({"type", "name"}), "tool_choice")
    return {"type": "function", "function": {"name": choice.get("name")}}


def _response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    """text.format as the chat route's response_format."""
    unknown_field(text, frozenset({"format", "verbosity"}), "text")
    form = text.get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise bad_request("'text.format' must be an object with a 'type'", "text.format")
    kind = form.get("type")
    if kind in ("text", "json_object"):
        unknown_field(form, frozenset({"type"}), "text.format")
        return {"type": kind}
    if kind == "json_schema":
        unknown_field(form, frozenset({"type", "name", "schema", "strict", "description"}), "text.format")
        schema = check_schema(form.get("schema"), "text.format.schema")
        spec = {k: form[k] for k in ("name", "strict", "description") if form.get(k) is not None}
        return {"type": "json_schema", "json_schema": {**spec, "schema": schema}}
    raise bad_request(f"'text.format.type' must be text, json_object or json_schema, got {kind!r}", "text.format.type")


def chat_body(request: ResponsesRequest) -> tuple[dict[str, Any], list[str]]:
    """(the chat body a Responses request stands for, the tools it ignores)."""
    body: dict[str, Any] = {"messages": _messages(request), "stream": request.stream}
    for name in ("model", "temperature", "top_p", "parallel_tool_calls"):
        if getattr(request, name) is not None:
            body[name] = getattr(request, name)
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    ignored: list[str] = []
    if request.tools:
        body["tools"], ignored = _tools(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.text is not None:
        form = _response_format(request.text)
        if form is not None:
            body["response_format"] = form
    effort = (request.reasoning or {}).get("effort")
    if effort is not None and not isinstance(effort, str):
        raise bad_request(f"'reasoning.effort' must be a string, got {effort!r}", "reasoning.effort")
    if effort in EFFORTS:  # another level (a newer client's) is left to the template's default
        body["reasoning_effort"] = effort
    extra = request.model_extra or {}
    body.update({name: extra[name] for name in PASSED_THROUGH if name in extra})
    return body, ignored


def prepare(
    raw: bytes, tokenizer: Any, defaults: ServerDefaults
) -> tuple[ResponsesRequest, ChatRequest, ChatSetup, list[int], list[str]]:
    """A Responses body -> (it, the chat request it stands for, its setup, the prompt ids, the tools
    ignored); a 400 / 404 (RequestError) names the field."""
    request = _validated(read_json(raw))
    check_model(request.model, defaults)
    body, ignored = chat_body(request)
    chat = parse_data(body, ChatRequest)
    setup = chat_setup(chat, tokenizer.chat_template, defaults.chat_template_kwargs)
    ids, setup = chat_prompt(tokenizer, chat, setup)
    return request, chat, setup, ids, ignored
