"""Request bodies of /v1/chat/completions and /v1/completions, validated strictly.

Types are strict (a string where a number belongs is a 400, not a silent conversion); unknown
fields are ignored, as OpenAI-compatible servers do, except the OpenAI features specfill does not
implement (several choices, log-probabilities, grammars, logit bias, tools and structured output
outside chat completions, and the sampling
settings of vLLM and llama.cpp that specfill lacks), which are refused by name rather than silently
dropped: a request never runs with a setting that has no effect. specfill's own fields sit at the
top level of the body, so the `openai` client passes them through `extra_body`.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.request import settings_of
from specfill.core.runtime import Drafting, PrefillMethod, SamplingConfig

from .errors import bad_request
from .reasoning import EFFORTS

NUMBER = Union[int, float]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: str
    text: str | None = None


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[Any] | None = None  # an assistant's calls (checked in chat.py)
    tool_call_id: str | None = None  # a tool result's call
    name: str | None = None
    reasoning_content: str | None = None  # an assistant's reasoning (llama.cpp's and DeepSeek's field)
    reasoning: str | None = None  # the same, as vLLM and OpenRouter name it
    thinking: str | None = None  # the same, as gpt-oss's chat template and Ollama name it

    def text(self, index: int) -> str:
        """The content as one string (text parts joined); other part types are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        pieces = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise bad_request(
                    f"messages[{index}]: content part of type {part.type!r} is not supported (text only)", "messages"
                )
            pieces.append(part.text)
        return "".join(pieces)


METHOD_CONFIGS = (H2OConfig, SpecPrefillConfig)  # every field with a request field is one (core/request.py SETTINGS)
_FIELD_TYPES = {int: int, float: NUMBER, str: str, bool: bool}  # a float setting takes a JSON integer too
# The server's own bounds, beyond the configs' checks: a request bounds the work it asks of a shared server
# (the library's num_draft_tokens has no cap: a caller's draft length is its own)
MAX_DRAFT_TOKENS = 32
LIMITS: dict[str, dict[str, Any]] = {"num_draft_tokens": {"le": MAX_DRAFT_TOKENS}}


def _settings_model(name: str, *configs: type, base: type[_Strict] = _Strict) -> type[_Strict]:
    """One request field per setting of `configs` that requests may set, named by the settings table
    (None: the server's default); the types are strict, the ranges the configs' own checks (and LIMITS)."""
    return create_model(
        name,
        __base__=base,
        **{
            s.server: (_FIELD_TYPES[s.kind] | None, Field(default=None, description=s.help, **LIMITS.get(s.server, {})))
            for config in configs
            for s in settings_of(config)
            if s.server
        },
    )


MethodFields = _settings_model("MethodFields", *METHOD_CONFIGS)
SamplingSettings = _settings_model("SamplingSettings", SamplingConfig)  # temperature, top_p, seed, top_k, ...
# method (full | h2o | specprefill | auto), auto_threshold, num_draft_tokens: the table's too
PrefillFields = _settings_model("PrefillFields", PrefillMethod, Drafting, base=MethodFields)


class SpecfillFields(PrefillFields):
    """Per-request prefill control (None: the server's default from its command line)."""

    return_progress: bool = False  # stream prefill progress events (llama.cpp's field)
    prompt_cache: Literal["exact", "approximate", "off"] | None = None  # reuse policy for this request
    # SpecPrefill: the chat template's segments never dropped (serve/segments.py); None: all three where
    # the request declares tools, else none
    protect: list[Literal["system", "tools", "last_user"]] | None = None
    # tool_choice auto: constrain each call from its opening on (chat.py); None: the server's default
    lazy_grammar: bool | None = None
    # vLLM's field: the reply's control tokens write no text, but the markers its tools are read by (reply_text.py)
    skip_special_tokens: bool = True


class SamplingFields(SamplingSettings):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    logprobs: bool | int | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise bad_request("stop strings must not be empty", "stop")
        return stops


class ChatRequest(SamplingFields, SpecfillFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None  # tools, tool_choice, response_format: checked in chat.py
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # llama.cpp's field: "auto" reads the reply's reasoning apart (reasoning_content), "none" leaves it in content
    reasoning_format: Literal["auto", "none"] = "auto"
    # vLLM's and llama.cpp's field: more variables for the chat template ({"enable_thinking": false}): chat.py
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's field: the template's enable_thinking / reasoning_effort, where it reads them (reasoning.py)
    reasoning_effort: Literal[EFFORTS] | None = None


class CompletionRequest(SamplingFields, SpecfillFields):
    prompt: str | list[int] | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


# OpenAI features refused by name: (field, test that the request uses it, why)
UNSUPPORTED = (
    ("n", lambda v: v not in (None, 1), "several choices per request (n > 1)"),
    ("best_of", lambda v: v not in (None, 1), "best_of > 1"),
    ("logprobs", lambda v: v not in (None, False, 0), "log-probabilities"),
    ("top_logprobs", lambda v: v not in (None, 0), "log-probabilities"),
    ("tools", lambda v: bool(v), "tool calls"),
    ("repeat_penalty", lambda v: v not in (None, 1), "llama.cpp's repeat_penalty (send repetition_penalty)"),
    ("repeat_last_n", lambda v: v not in (None, 64), "a penalty window other than the last 64 tokens"),
    ("typical_p", lambda v: v not in (None, 1), "typical_p sampling"),
    ("tfs_z", lambda v: v not in (None, 1), "tail-free sampling"),
    ("top_a", lambda v: v not in (None, 0), "top_a sampling"),
    ("top_n_sigma", lambda v: v not in (None, -1), "top-n-sigma sampling"),
    ("mirostat", lambda v: v not in (None, 0), "mirostat sampling"),
    ("dynatemp_range", lambda v: v not in (None, 0), "dynamic temperature"),
    ("xtc_probability", lambda v: v not in (None, 0), "XTC sampling"),
    ("dry_multiplier", lambda v: v not in (None, 0), "DRY repetition penalties"),
    ("min_tokens", lambda v: v not in (None, 0), "min_tokens"),
    ("ignore_eos", lambda v: v not in (None, False), "ignore_eos"),
    ("length_penalty", lambda v: v not in (None, 1), "length_penalty (beam search)"),
    ("use_beam_search", lambda v: v not in (None, False), "beam search"),
    ("stop_token_ids", lambda v: bool(v), "stop_token_ids"),
    ("bad_words", lambda v: bool(v), "bad_words"),
    ("guided_json", lambda v: v is not None, "guided decoding"),
    ("guided_regex", lambda v: v is not None, "guided decoding"),
    ("guided_choice", lambda v: v is not None, "guided decoding"),
    ("guided_grammar", lambda v: v is not None, "guided decoding"),
    ("grammar", lambda v: bool(v), "grammars"),
    ("json_schema", lambda v: v is not None, "JSON schemas"),
    ("echo", lambda v: v is True, "echoing the prompt"),
    ("suffix", lambda v: v is not None, "suffix (insertion) completions"),
    (
        "response_format",
        lambda v: isinstance(v, dict) and v.get("type") not in (None, "text"),
        "structured output (response_format other than text)",
    ),
    ("logit_bias", lambda v: bool(v), "logit_bias"),
)
CHAT_FEATURES = frozenset({"tools", "response_format"})  # the chat route reads these (chat.py)


MAX_DEPTH = 64  # arrays and objects inside each other (JSON schemas and tool arguments are checked recursively)
TOO_DEEP = f"the request body nests arrays and objects more than {MAX_DEPTH} deep"


def read_json(raw: bytes) -> dict[str, Any]:
    """A JSON object body nested at most MAX_DEPTH deep, its strings valid Unicode, or a RequestError(400)."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise bad_request(f"malformed JSON body: {err}") from None
    except RecursionError:
        raise bad_request(TOO_DEEP) from None
    _check_values(data)
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _check_values(value: Any) -> None:
    """Arrays and objects nested at most MAX_DEPTH deep, and no string with a lone UTF-16 surrogate
    (a \\ud800 escape: the tokenizer cannot read it), walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise bad_request(f"the request body has a string with a lone surrogate: {item[:40]!r}") from None
            continue
        children = [*item, *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise bad_request(TOO_DEEP)
        stack.extend((child, depth + 1) for child in children)


def parse_body(raw: bytes, kind: type[ChatRequest] | type[CompletionRequest]) -> Any:
    """The validated request, or a RequestError(400) whose message names the field at fault."""
    return parse_data(read_json(raw), kind)


def parse_data(data: dict[str, Any], kind: type[ChatRequest] | type[CompletionRequest]) -> Any:
    """parse_body for a body already read (the Anthropic route translates its body into a chat one)."""
    try:
        request = kind.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"] if not _is_type_tag(p)) or "body"
        raise bad_request(
            f"invalid field '{where}': {first['msg']} (got {_short(first.get('input'))})", where.split(".")[0]
        ) from None
    extra = request.model_extra or {}
    for name, used, what in UNSUPPORTED:
        if name in CHAT_FEATURES and kind is ChatRequest:
            continue
        value = getattr(request, name, None) if name in type(request).model_fields else extra.get(name)
        if used(value):
            raise bad_request(f"'{name}': {what} is not supported by specfill serve", name)
    return request


def _is_type_tag(part: Any) -> bool:
    """Whether a pydantic error location part names a union member's type ('int', 'list[int]'),
    not a field: the location a user reads is the field path alone ('keep_ratio', not 'keep_ratio.int')."""
    return isinstance(part, str) and (part in ("int", "float", "str", "bool") or "[" in part)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
