"""A chat request's prompt and the rules its reply is read back by: messages (assistant tool calls
and tool results included), tools, tool_choice, parallel_tool_calls and response_format, rendered
through the model's own chat template as transformers renders them.

tool_choice "none" leaves the tools out of the template and the reply unparsed; "auto" lets the
model write text, calls or both, each call constrained from its opening on (below). "required"
and a named function start the reply with the format's opening (and the name) in the prompt
(tool_parsers.ToolFormat.forced), and where the format has a call grammar (hermes, llama3,
harmony, kimi_k2 with JSON arguments, qwen3_coder with its XML parameters: ToolFormat.call) the
rest of the reply is constrained (reply_grammar; reply_grammar.py, json_grammar.py,
token_mask.py): for "required" the name is one of the tools', then that tool's arguments by its
parameters schema (JSON of it, or qwen3_coder's `<parameter=P>` blocks typed by it), then the
format's closing (`}\n</tool_call>` for hermes, `}` for llama3, `</function>\n</tool_call>` for
qwen3_coder, `<|tool_call_end|><|tool_calls_section_end|>` for kimi_k2; harmony's JSON is
followed by its stop token), then EOS: one call per reply. Under "auto" the same grammar is
lazy (llama.cpp's lazy grammars): the reply is free until it writes the format's call opening
(`<tool_call>`, qwen3_coder's `<tool_call>\n<function=`, harmony's `<|channel|>commentary
to=functions.`, kimi_k2's `<|tool_calls_section_begin|>`), then constrained to the rest of one
call, then free again (text, EOS or another call; parallel_tool_calls false still keeps the first
call only, when the reply is read); not for llama3, whose opening is plain JSON (UNTRIGGERED); off
with the request's `lazy_grammar: false` or the server's ServerDefaults.lazy_grammar
(plan.build_plan). The other formats (mistral, glm47, the other mlx-lm ones) are continued, not
constrained. A JSON response_format is constrained the same way when no tools are in play
(json_object: any JSON object; json_schema: that schema), still started with "{" for an object,
the schema still shown to the model in the system message, and the text still checked once it is
complete (OutputCheck; the verdict travels in the response's `specfill.response_format`): the
constraint follows the schema's structure (json_grammar.py says which keywords), the check all of it.
Claude Code's attribution line (`x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;
cch=...;`, the first system block of its requests) is removed from system and developer messages
(without_billing_header): it changes with the client's version, entry point and, from 2.1.x, every
request, so kept it would end the prompt cache's shared prefix a few tokens into the system prompt;
it is metadata for Anthropic's billing, not instructions for the model. A router that translates
Claude Code's requests into chat completions (LiteLLM, claude-code-router) hands it on here too.
A reply's reasoning (the template's thinking tags) is read apart before its calls (reasoning.py:
ChatSetup.reasoning, which chat_prompt tells whether the prompt left it open); an assistant message's
reasoning_content (or vLLM's `reasoning`, gpt-oss's and Ollama's `thinking`) goes back to the template as
reasoning_content and as `thinking` (gpt-oss's template renders a tool-calling turn's analysis from it: without
it the model read its calls' results without the reasoning that made them, and the next prompt parted from
the cached reply at that turn's start rather than at its call).
Everything a request can get wrong here is a 400 naming the field, before the request queues.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from specfill.api import encode_prompt
from specfill.core import SpecfillError

from .errors import bad_request
from .protocol import ChatRequest, Message
from .reasoning import Reasoning, detect_reasoning, effort_variables
from .reply_grammar import ReplyGrammar
from .tool_parsers import FORMATS, ToolFormat, detect_format

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # OpenAI's rule (a-z, A-Z, 0-9, _ and -, at most 64), plus . and :
TOOL_FIELDS = frozenset({"type", "function"})
FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
SCHEMA_NOTE = "Reply with one JSON value that matches this JSON schema, and nothing else:\n"
# formats whose call opening (ToolFormat.required) is ordinary text, not a marker: no lazy grammar
# under tool_choice auto (llama3's '{"name": "' starts any JSON with a "name" key, anywhere in a reply)
UNTRIGGERED = frozenset({"llama3"})
BILLING_HEADER = "x-anthropic-billing-header:"
BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*\n*", re.MULTILINE)  # the line and blank lines after


def unknown_field(value: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """A 400 naming the first field of `value` that is not in `allowed`."""
    for key in value:
        if key not in allowed:
            raise bad_request(
                f"unknown field '{where}.{key}' (allowed: {', '.join(sorted(allowed))})", f"{where}.{key}"
            )


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON schema object, checked against its metaschema (a 400 naming `where` otherwise)."""
    if not isinstance(schema, dict):
        raise bad_request(f"'{where}' must be a JSON schema object, got {type(schema).__name__}", where)
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as err:
        path = "".join(f"[{p!r}]" for p in err.absolute_path)
        raise bad_request(
            f"'{where}' is not a valid JSON schema: {err.message} (at {path or 'the top'})", where
        ) from None
    return schema


# what the template already gets from the server: a request's chat_template_kwargs may not set them
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def check_template_kwargs(value: Any, where: str) -> dict[str, Any]:
    """chat_template_kwargs (vLLM's and llama.cpp's field: `{"enable_thinking": false}` for Qwen3): an
    object whose keys are not the variables the server sets; a 400 naming `where` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"'{where}' must be an object, got {type(value).__name__}", where)
    if taken := sorted(value.keys() & TEMPLATE_VARIABLES):
        raise bad_request(f"'{where}.{taken[0]}': the server sets the template's {taken[0]}", where)
    return dict(value)


def check_tool_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise bad_request(f"'{where}' must be 1-64 letters, digits, '_', '-', '.' or ':', got {name!r}", where)
    return name


def tool_definitions(tools: list[Any]) -> tuple[dict[str, Any], ...]:
    """OpenAI function tools, checked strictly (an unknown field is a 400 naming it): what the
    chat template gets, as transformers passes them ({"type": "function", "function": {...}})."""
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"'{where}' must be an object, got {type(tool).__name__}", where)
        if tool.get("type") != "function":
            raise bad_request(
                f"'{where}.type': only function tools are supported, got {tool.get('type')!r}", f"{where}.type"
            )
        unknown_field(tool, TOOL_FIELDS, where)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"'{where}.function' must be an object with a name", f"{where}.function")
        unknown_field(function, FUNCTION_FIELDS, f"{where}.function")
        name = check_tool_name(function.get("name"), f"{where}.function.name")
        if not isinstance(function.get("description", ""), str):
            raise bad_request(f"'{where}.function.description' must be a string", f"{where}.function.description")
        if not isinstance(function.get("strict", False), bool):
            raise bad_request(f"'{where}.function.strict' must be true or false", f"{where}.function.strict")
        parameters = check_schema(function.get("parameters", EMPTY_PARAMETERS), f"{where}.function.parameters")
        out.append({"type": "function", "function": {**function, "name": name, "parameters": parameters}})
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise bad_request(f"'tools': two tools are named {next(n for n in names if names.count(n) > 1)!r}", "tools")
    return tuple(out)


def tool_choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    """("auto" | "none" | "required", the named function or None)."""
    if value is None:
        return ("auto" if names else "none"), None
    if value in ("auto", "none", "required"):
        if value == "required" and not names:
            raise bad_request("'tool_choice' is \"required\" but the request has no tools", "tool_choice")
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        unknown_field(value, TOOL_FIELDS, "tool_choice")
        unknown_field(value["function"], frozenset({"name"}), "tool_choice.function")
        name = value["function"].get("name")
        if name not in names:
            raise bad_request(f"'tool_choice.function.name': {name!r} is not one of the request's tools", "tool_choice")
        return "required", name
    raise bad_request(
        '\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


@dataclass(frozen=True)
class OutputCheck:
    """response_format json_object / json_schema: the reply's text is checked once complete."""

    kind: str  # "json_object" or "json_schema"
    schema: dict[str, Any] | None = None

    @property
    def wants_object(self) -> bool:
        return self.schema is None or self.schema.get("type") == "object" or "properties" in self.schema

    def check(self, text: str) -> str | None:
        """None when the text is valid, else why not (one line)."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            return f"not JSON: {err}"
        if self.schema is None:
            return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
        from jsonschema.exceptions import best_match
        from jsonschema.validators import validator_for

        error = best_match(validator_for(self.schema)(self.schema).iter_errors(value))
        if error is None:
            return None
        path = "".join(f"[{p!r}]" for p in error.absolute_path)
        return f"does not match the schema at {path or 'the top'}: {error.message}"


def output_check(value: Any) -> OutputCheck | None:
    """response_format: None (text), or the check of a JSON reply."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("'response_format' must be an object with a 'type'", "response_format")
    unknown_field(value, frozenset({"type", "json_schema"}), "response_format")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputCheck("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request(
                "'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema"
            )
        unknown_field(spec, frozenset({"name", "schema", "strict", "description"}), "response_format.json_schema")
        return OutputCheck("json_schema", check_schema(spec.get("schema"), "response_format.json_schema.schema"))
    raise bad_request(
        f"'response_format.type' must be text, json_object or json_schema, got {kind!r}", "response_format.type"
    )


@dataclass(frozen=True)
class ChatSetup:
    """What tools and response_format change about one chat request: the tools the template gets,
    the text the reply is started with (in the prompt, and the reply's first text), and how the
    reply is read back (the call format, at most how many calls, the output check)."""

    tools: tuple[dict[str, Any], ...] = ()  # empty: the template gets none
    format: ToolFormat | None = None  # None: the reply is text, unparsed
    prefix: str = ""
    max_calls: int | None = None
    output: OutputCheck | None = None
    grammar: ReplyGrammar | None = None  # what the reply is constrained to (None: unconstrained)
    reasoning: Reasoning | None = None  # how the reply's reasoning is read apart (reasoning.py; None: it is not)
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # more variables for the template


def reply_grammar(fmt: ToolFormat, name: str | None, lazy: bool = False) -> ReplyGrammar | None:
    """tool_choice "required" (name None: a call to any of the tools) or a named function: the
    one call the reply is constrained to, after its forced start; None where the format has no
    call grammar (ToolFormat.call). lazy (tool_choice "auto"): each call the reply
    opens with the forced start for any tool is constrained so; None where that opening is
    ordinary text (UNTRIGGERED)."""
    if fmt.call is None or (lazy and fmt.name in UNTRIGGERED):
        return None
    head, close = fmt.call
    branches = []
    for tool in fmt.tools:
        function = tool["function"]
        if name is None or function["name"] == name:
            opening = fmt.required + head.format(name=json.dumps(function["name"]), bare=function["name"])
            branches.append((opening, json.dumps(function["parameters"]), close))
    return ReplyGrammar(tuple(branches), start=fmt.forced(name), lazy=lazy, arguments=fmt.arguments)


def output_grammar(output: OutputCheck | None, prefix: str) -> ReplyGrammar | None:
    """response_format json_object (any JSON object) or json_schema: the JSON value the reply is
    constrained to, after its forced start ("{" for an object)."""
    if output is None:
        return None
    schema = output.schema if output.schema is not None else {"type": "object"}
    return ReplyGrammar((("", json.dumps(schema), ""),), start=prefix)


def chat_setup(request: ChatRequest, template: str | None, template_kwargs: dict[str, Any] | None = None) -> ChatSetup:
    """The request's tools, tool_choice, parallel_tool_calls, response_format, chat_template_kwargs (over
    the server's `template_kwargs`, over what reasoning_effort sets), checked against what the model's
    chat template can do (tools it does not render would have no effect: a 400)."""
    variables = {  # the client's reasoning effort, under the server's variables, under the request's own
        **effort_variables(template, request.reasoning_effort),
        **(template_kwargs or {}),
        **check_template_kwargs(request.chat_template_kwargs, "chat_template_kwargs"),
    }
    tools = tool_definitions(request.tools) if request.tools else ()
    choice, name = tool_choice(request.tool_choice, [t["function"]["name"] for t in tools])
    output = output_check(request.response_format)
    reasoning = detect_reasoning(template) if request.reasoning_format != "none" else None
    if not tools or choice == "none":
        prefix = "{" if output is not None and output.wants_object else ""
        fmt = detect_format(template)  # a harmony reply is read by its channels, with tools or without
        return ChatSetup(
            format=fmt if fmt is not None and fmt.messages else None,
            prefix=prefix,
            output=output,
            grammar=output_grammar(output, prefix),
            reasoning=reasoning,
            template_kwargs=variables,
        )
    if not template or "tools" not in template:
        raise bad_request(
            "'tools': the model's chat template does not render tools (give a template that does with --chat-template)",
            "tools",
        )
    fmt = detect_format(template)
    if fmt is None:
        raise bad_request(
            "'tools': the model's chat template writes tool calls in a format specfill does not "
            f"read (it reads {', '.join(sorted(FORMATS))}: docs/serve.md)",
            "tools",
        )
    missing = fmt.missing()
    if missing is not None:
        raise bad_request(
            f"'tools': the model writes tool calls in the {fmt.name} format, read with mlx-lm: {missing}", "tools"
        )
    bound = fmt.bind(tools)
    return ChatSetup(
        tools=tools,
        format=bound,
        prefix=fmt.forced(name) if choice == "required" else "",
        max_calls=1 if request.parallel_tool_calls is False else None,
        output=output,
        grammar=reply_grammar(bound, name, lazy=choice == "auto"),
        reasoning=reasoning,
        template_kwargs=variables,
    )


def _template_call(call: Any, where: str) -> dict[str, Any]:
    """An assistant message's tool call as templates read it: arguments as an object (vLLM and
    transformers do the same; Qwen's template writes them with tojson)."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise bad_request(
            f'\'{where}\' must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', where
        )
    function = call["function"]
    name = check_tool_name(function.get("name"), f"{where}.function.name")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except (json.JSONDecodeError, RecursionError):
            pass  # the text as it was: the template writes what the model wrote
    return {"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": arguments}}


def without_billing_header(text: str) -> str:
    """`text` without Claude Code's attribution lines (a line starting `x-anthropic-billing-header:`,
    with the blank lines after it); other text as it was. vLLM, SGLang and vllm-mlx drop the line
    too; llama.cpp blanks its `cch=` hash; Ollama's launcher has the client leave it out."""
    return BILLING_LINE.sub("", text) if BILLING_HEADER in text else text


def template_messages(messages: list[Message], system_note: str | None = None) -> list[dict[str, Any]]:
    """Messages as a chat template reads them (transformers' shapes): content as text, an
    assistant's tool_calls, a tool result's tool_call_id and name; system_note joins the system
    message (one is added first when there is none)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        item: dict[str, Any] = {"role": m.role, "content": m.text(i)}
        if m.role in ("system", "developer"):
            item["content"] = without_billing_header(item["content"])
        if m.tool_calls:
            if m.role != "assistant":
                raise bad_request(f"'messages[{i}].tool_calls': only assistant messages carry tool calls", "messages")
            item["tool_calls"] = [
                _template_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "assistant" and (thought := m.reasoning_content or m.reasoning or m.thinking):
            item["reasoning_content"] = thought  # Qwen3's, GLM's, MiniMax's templates read it
            if not (m.tool_calls and item["content"]):  # gpt-oss's reads `thinking`, and refuses it beside a
                item["thinking"] = thought  # call's content (which it writes as the call's analysis instead)
        if m.role == "tool":
            item["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            item["name"] = m.name
        out.append(item)
    if system_note:
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system_note}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": system_note})
    return out


def chat_prompt(tokenizer: Any, request: ChatRequest, setup: ChatSetup = ChatSetup()) -> tuple[list[int], ChatSetup]:
    """The chat template rendered server-side (with the request's tools), the reply's forced start
    appended (answer_start), tokenized (BOS only if the template lacks it); and the setup, its reasoning
    told whether the reply starts inside it."""
    schema = setup.output.schema if setup.output is not None else None
    note = SCHEMA_NOTE + json.dumps(schema) if schema is not None else None
    messages = template_messages(request.messages, note)
    extra = {**setup.template_kwargs, **({"tools": [dict(t) for t in setup.tools]} if setup.tools else {})}
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra)
    except SpecfillError as err:
        raise bad_request(str(err), "messages") from None
    tail, setup = answer_start(setup, text)
    return encode_prompt(tokenizer, text + tail), setup


def answer_start(setup: ChatSetup, prompt: str) -> tuple[str, ChatSetup]:
    """What follows the rendered `prompt`: the reply's forced start, after a close of the reasoning the
    prompt left open (a forced start is the answer's: the JSON object, the call; the prompt then ends as
    the template writes it with thinking off, in the model's own form rather than an answer inside an open
    think block); and the setup, its reasoning told whether the reply starts inside it."""
    if setup.reasoning is None:
        return setup.prefix, setup
    reasoning = setup.reasoning.after(prompt)
    if setup.prefix and reasoning.started:
        return reasoning.closing(prompt) + setup.prefix, replace(setup, reasoning=replace(reasoning, started=False))
    return setup.prefix, replace(setup, reasoning=reasoning)
