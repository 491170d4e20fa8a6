"""A validated request turned into what one generation needs: token ids, sampling, prefill method.

Everything a request can get wrong is checked here, in the HTTP handler, before the request
queues: a 400 comes back at once and the worker only ever sees runnable jobs.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from specfill.api import encode_prompt, prefill_method
from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig, SpecfillError
from specfill.core.runtime import PrefillMethod, SamplingConfig
from specfill.core.sampling import HOST_FIELDS

from .errors import bad_request
from .protocol import ChatRequest, CompletionRequest, SpecfillFields

METHODS = ("full", "h2o", "specprefill")


@dataclass(frozen=True)
class ServerDefaults:
    """The server's command-line settings; every request field left out takes these."""

    model_id: str  # the name responses carry
    model_names: tuple[str, ...] = ()  # every name requests may use (--served-model-name); model_id always
    method: str = "full"
    h2o: H2OConfig = field(default_factory=H2OConfig)
    specprefill: SpecPrefillConfig = field(default_factory=SpecPrefillConfig)
    speculator: Any = None  # "self:K" or a loaded model; None: specprefill requests are refused
    speculator_context: int | None = None  # a separate speculator's context (None: the main model's)
    max_tokens: int = 512  # when a request gives none (clipped to the room left in the context)
    prompt_cache: str = "exact"
    sampling: dict[str, Any] = field(default_factory=dict)  # --top-k etc. (core/sampling.py HOST_FIELDS)

    def names(self) -> tuple[str, ...]:
        """The served names, model_id first."""
        return (self.model_id, *(n for n in self.model_names if n != self.model_id))


@dataclass
class Plan:
    """One runnable generation (built in the handler, run by the worker thread)."""

    kind: str  # "chat" or "completion"
    ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    method: PrefillMethod
    method_name: str
    stops: list[str]
    stream: bool
    include_usage: bool
    return_progress: bool
    prompt_cache: str
    num_draft_tokens: int | None = None  # speculative decoding (None: off)
    draft_model: Any = None  # the draft: the server's speculator; None after SpecPrefill (it drafts from its KV)
    notes: list[str] = field(default_factory=list)  # settings the library adjusted (clamping)
    created: float = field(default_factory=time.time)
    queue_seconds: float = 0.0  # time spent waiting for the device (set by the scheduler)
    cancelled: threading.Event = field(default_factory=threading.Event)


def chat_prompt_ids(tokenizer: Any, request: ChatRequest) -> list[int]:
    """The chat template rendered server-side and tokenized (BOS only if the template lacks it)."""
    messages = [{"role": m.role, "content": m.text(i)} for i, m in enumerate(request.messages)]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except SpecfillError as err:
        raise bad_request(str(err), "messages") from None
    bos = tokenizer.token_text(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else None
    return tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))


def completion_prompt_ids(tokenizer: Any, request: CompletionRequest, vocab_size: int) -> list[int]:
    """A string prompt, a one-string list, or token ids (checked against the vocabulary). A string
    gets the API's BOS rule (specfill.api.encode_prompt), so the server and `generate` see the same ids."""
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise bad_request("a list of several prompts is not supported (one prompt per request)", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode_prompt(tokenizer, prompt)
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary (size {vocab_size})", "prompt")
    return list(prompt)


def build_plan(kind: str, request: ChatRequest | CompletionRequest, ids: list[int], defaults: ServerDefaults,
               context: int) -> Plan:
    """The Plan for a parsed request, or a 400 naming the field at fault."""
    if not ids:
        raise bad_request("the prompt is empty", "messages" if kind == "chat" else "prompt")
    room = context - len(ids)
    asked = getattr(request, "max_completion_tokens", None) or request.max_tokens
    if room < 1 or (asked is not None and asked > room):
        wanted = asked if asked is not None else 1
        raise bad_request(f"prompt of {len(ids)} tokens plus max_tokens {wanted} exceeds the model's context "
                          f"of {context} tokens", "messages" if kind == "chat" else "prompt")
    max_tokens = asked if asked is not None else min(defaults.max_tokens, room)
    host = {name: getattr(request, name) for name in HOST_FIELDS if getattr(request, name) is not None}
    try:
        sampling = SamplingConfig(float(request.temperature if request.temperature is not None else 0.0),
                                  float(request.top_p if request.top_p is not None else 1.0), request.seed,
                                  **{**defaults.sampling, **host})
    except ConfigError as err:
        raise bad_request(str(err), str(err).split(" ", 1)[0]) from None  # the message starts with the field
    name = request.method or defaults.method
    notes: list[str] = []
    method = request_method(name, request, defaults, len(ids), notes)
    if request.num_draft_tokens is not None and sampling.host_side:
        raise bad_request("num_draft_tokens with top_k, min_p or a penalty is not supported yet", "num_draft_tokens")
    if request.num_draft_tokens is not None and defaults.speculator is None:
        raise bad_request("num_draft_tokens needs a draft model: start the server with --speculator PATH or "
                          "--speculator self:K (it drafts)", "num_draft_tokens")
    return Plan(kind=kind, ids=ids, max_tokens=max_tokens, sampling=sampling, method=method, method_name=name,
                num_draft_tokens=request.num_draft_tokens,
                draft_model=None if name == "specprefill" else defaults.speculator,
                stops=request.stop_strings(), stream=request.stream,
                include_usage=bool(request.stream_options and request.stream_options.include_usage),
                return_progress=request.return_progress,
                prompt_cache=request.prompt_cache or defaults.prompt_cache, notes=notes)


def request_method(name: str, request: SpecfillFields, defaults: ServerDefaults, prompt_tokens: int,
                   notes: list[str]) -> PrefillMethod:
    """The PrefillMethod: the server's settings overridden by the request's fields."""
    if name not in METHODS:
        if name == "auto" and not _library_has("auto"):
            raise bad_request("method 'auto' is not available yet in this version of specfill "
                              "(choose full, h2o or specprefill)", "method")
        if not _library_has(name):
            raise bad_request(f"unknown method {name!r} (choose full, h2o or specprefill)", "method")
    h2o_fields = {"chunk_size": request.h2o_chunk_size, "batch_size": request.h2o_batch_size,
                  "local": request.h2o_local, "heavy": request.h2o_heavy}
    spec_fields: dict[str, Any] = {"lookahead": request.lookahead}
    if request.keep_tokens is not None:
        spec_fields["keep_tokens"] = request.keep_tokens
    elif request.keep_ratio is not None:
        spec_fields.update(keep_ratio=request.keep_ratio, keep_tokens=None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h2o = dataclasses.replace(defaults.h2o, **{k: v for k, v in h2o_fields.items() if v is not None})
            spec = dataclasses.replace(defaults.specprefill,
                                       **{k: v for k, v in spec_fields.items() if k != "lookahead" or v is not None})
        notes.extend(str(w.message) for w in caught)
    except ConfigError as err:
        param = _field_named(str(err), {**{f"h2o_{k}": v for k, v in h2o_fields.items()}, **spec_fields})
        raise bad_request(f"'{param}': {err}" if param != "method" else str(err), param) from None
    if name == "specprefill":
        if defaults.speculator is None:
            raise bad_request("method 'specprefill' needs a speculator: start the server with --speculator "
                              "PATH or --speculator self:K", "method")
        if defaults.speculator_context is not None and prompt_tokens > defaults.speculator_context:
            raise bad_request(f"prompt of {prompt_tokens} tokens exceeds the speculator's context of "
                              f"{defaults.speculator_context} tokens", "method")
    try:
        return prefill_method(name, h2o=h2o, specprefill=spec,
                              speculator=defaults.speculator if name in ("specprefill", "auto") else None)
    except ConfigError as err:
        raise bad_request(str(err), "method") from None


def _field_named(message: str, fields: dict[str, Any]) -> str:
    """The request field a config error is about: the one set whose setting name the message
    names ("keep_ratio must be in (0, 1]" -> keep_ratio; "chunk_size ..." -> h2o_chunk_size)."""
    for field_name, value in fields.items():
        setting = field_name.removeprefix("h2o_")
        if value is not None and any(n in message for n in (field_name, setting, setting.replace("_", " "))):
            return field_name
    return "method"


def _library_has(name: str) -> bool:
    """Whether the library's PrefillMethod accepts this method name (so `auto` turns on by itself
    once the library grows it)."""
    try:
        PrefillMethod(name)
    except ConfigError:
        return False
    return True
