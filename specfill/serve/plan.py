"""A validated request turned into what one generation needs: token ids, sampling, prefill method.

Everything a request can get wrong is checked here, in the HTTP handler, before the request
queues: a 400 comes back at once and the worker only ever sees runnable jobs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from specfill.api import encode_prompt
from specfill.core import ConfigError, H2OConfig, PromptTooLongError, SpecPrefillConfig
from specfill.core.config import KEEP_RULES
from specfill.core.plan import check_generation_fits, check_speculator_context
from specfill.core.request import GenerationRequest, build_request, server_field, settings_of
from specfill.core.sampling import HOST_FIELDS

from .errors import bad_request
from .protocol import ChatRequest, CompletionRequest
from .reply_grammar import ReplyGrammar


@dataclass(frozen=True)
class ServerDefaults:
    """The server's command-line settings; every request field left out takes these."""

    model_id: str  # the name responses carry
    model_names: tuple[str, ...] = ()  # every name requests may use (--served-model-name); model_id always
    model_patterns: tuple[str, ...] = ()  # further names, shell-style ("claude-*": --served-model-pattern)
    method: str = "full"
    h2o: H2OConfig = field(default_factory=H2OConfig)
    specprefill: SpecPrefillConfig = field(default_factory=SpecPrefillConfig)
    speculator: Any = None  # "self:K" or a loaded model; None: specprefill requests are refused
    speculator_context: int | None = None  # a separate speculator's context (None: the main model's)
    max_tokens: int = 512  # when a request gives none (clipped to the room left in the context)
    prompt_cache: str = "exact"
    sampling: dict[str, Any] = field(default_factory=dict)  # --top-k etc. (core/sampling.py HOST_FIELDS)
    lazy_grammar: bool = True  # tool_choice auto: each call constrained from its opening on (chat.py)
    # --chat-template-kwargs: more variables for the chat template (a request's chat_template_kwargs override them)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def names(self) -> tuple[str, ...]:
        """The served names, model_id first."""
        return (self.model_id, *(n for n in self.model_names if n != self.model_id))

    def serves(self, name: str) -> bool:
        """Whether requests may name `name`: one of names(), or a name model_patterns match
        (fnmatch, case-sensitive: an agent's own model names, e.g. Claude Code's small model)."""
        return name in self.names() or any(fnmatch.fnmatchcase(name, p) for p in self.model_patterns)


@dataclass
class Plan:
    """One runnable generation (built in the handler, run by the worker thread)."""

    kind: str  # "chat" or "completion"
    ids: list[int]
    request: GenerationRequest  # the settings, built and checked by core/request.build_request
    method_name: str  # the method the client asked for ("auto" before it resolves)
    stops: list[str]
    stream: bool
    include_usage: bool
    return_progress: bool
    prompt_cache: str
    notes: list[str] = field(default_factory=list)  # settings the library adjusted (clamping)
    created: float = field(default_factory=time.time)
    queue_seconds: float = 0.0  # time spent waiting for the device (set by the scheduler)
    cancelled: threading.Event = field(default_factory=threading.Event)
    grammar: ReplyGrammar | None = None  # the reply's constraint (chat.py; Engine.run decodes by it)
    skip_special_tokens: bool = True  # the reply's control tokens write no text (reply_text.py)


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


SPECPREFILL_METHODS = ("specprefill", "auto")  # the methods that may run SpecPrefill (the server's speculator)


def method_name(request: ChatRequest | CompletionRequest, defaults: ServerDefaults) -> str:
    """The method a request runs: its own, else the server's default."""
    return request.method or defaults.method


def build_plan(
    kind: str,
    request: ChatRequest | CompletionRequest,
    ids: list[int],
    defaults: ServerDefaults,
    context: int,
    protected: tuple[tuple[int, int], ...] = (),
    notes: list[str] | None = None,
    grammar: ReplyGrammar | None = None,
) -> Plan:
    """The Plan for a parsed request: the HTTP fields, the server's defaults filling the rest,
    translated into one core/request.build_request call; a 400 names the field at fault.
    protected: SpecPrefill's protected spans of ids (serve/segments.py); notes: said so far;
    grammar: what the reply is constrained to (chat.ChatSetup.grammar; a lazy one only where the
    request's lazy_grammar, else the server's, is on)."""
    where = "messages" if kind == "chat" else "prompt"
    if not ids:
        raise bad_request("the prompt is empty", where)
    asked = getattr(request, "max_completion_tokens", None) or request.max_tokens
    room = context - len(ids)  # what the context leaves the reply
    notes = list(notes or [])
    if asked is None:
        max_tokens = max(1, min(defaults.max_tokens, room))
    elif 0 < room < asked <= context:
        # An agent asks its own output budget whatever the conversation's length (Claude Code 32000, Qwen Code
        # 32768): clipped to what the context leaves, as llama.cpp's server, Ollama and LM Studio do; the reply
        # then ends at the context's end ("length"). A max_tokens past the whole context fits no prompt: a 400.
        max_tokens = room
        notes.append(
            f"max_tokens {asked} clipped to {room}: the prompt's {len(ids)} tokens leave {room} "
            f"of the model's context of {context}"
        )
    else:
        max_tokens = asked
    name = method_name(request, defaults)
    try:
        check_generation_fits(len(ids), max_tokens, context)
    except PromptTooLongError as err:
        raise bad_request(str(err), where) from None
    if name == "specprefill" and defaults.speculator_context is not None:
        try:
            check_speculator_context(len(ids), defaults.speculator_context)
        except PromptTooLongError as err:  # a separate speculator reads the whole prompt too: about the method
            raise bad_request(str(err), "method") from None
    lazy = defaults.lazy_grammar if request.lazy_grammar is None else request.lazy_grammar
    if grammar is not None and grammar.lazy and not lazy:
        grammar = None  # tool_choice auto unconstrained: no host-side processor, drafting kept
    built = _build(request, defaults, name, max_tokens, notes)
    if protected and built.method.specprefill is not None:  # specprefill and auto: _build's
        spec = dataclasses.replace(built.method.specprefill, protected=protected)
        built = dataclasses.replace(built, method=dataclasses.replace(built.method, specprefill=spec))
    return Plan(
        kind=kind,
        ids=ids,
        request=built,
        method_name=name,
        stops=request.stop_strings(),
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        return_progress=request.return_progress,
        prompt_cache=request.prompt_cache or defaults.prompt_cache,
        notes=notes,
        grammar=grammar,
        skip_special_tokens=request.skip_special_tokens,
    )


def _build(
    request: ChatRequest | CompletionRequest, defaults: ServerDefaults, name: str, max_tokens: int, notes: list[str]
) -> GenerationRequest:
    """build_request from the request's fields over the server's defaults; warnings become notes."""
    h2o_given = _given(request, H2OConfig)
    spec_given = _given(request, SpecPrefillConfig)
    keep = {rule: spec_given.pop(rule, None) for rule in KEEP_RULES}  # the keep rule goes through with_keep
    sampling = {**defaults.sampling, **{f: getattr(request, f) for f in HOST_FIELDS if getattr(request, f) is not None}}
    speculator = defaults.speculator if name in SPECPREFILL_METHODS else None
    drafts = request.num_draft_tokens is not None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h2o = dataclasses.replace(defaults.h2o, **h2o_given)
            spec = defaults.specprefill.with_keep(keep["keep_ratio"], keep["keep_tokens"], keep["keep_mass"])
            spec = dataclasses.replace(spec, **spec_given)
            built = build_request(
                max_tokens=max_tokens,
                temperature=request.temperature if request.temperature is not None else 0.0,
                top_p=request.top_p if request.top_p is not None else 1.0,
                seed=request.seed,
                **sampling,
                method=name,
                h2o=h2o if name in ("h2o", "auto") else None,
                specprefill=spec if name in SPECPREFILL_METHODS else None,
                speculator=speculator,
                draft_model=defaults.speculator if drafts and name != "specprefill" else None,
                num_draft_tokens=request.num_draft_tokens,
                auto_threshold=request.auto_threshold,
            )
        notes.extend(str(w.message) for w in caught)
    except ConfigError as err:
        param = _field_at_fault(err, request)
        raise bad_request(f"'{param}': {err}" if param != "method" else str(err), param) from None
    return built


def _given(request: ChatRequest | CompletionRequest, config: type) -> dict[str, Any]:
    """config's fields the request sets (by their request fields, core/request.py SETTINGS)."""
    return {
        s.field: getattr(request, s.server)
        for s in settings_of(config)
        if s.server and getattr(request, s.server) is not None
    }


def _field_at_fault(err: ConfigError, request: ChatRequest | CompletionRequest) -> str:
    """The request field a ConfigError is about: the first of the fields it names (err.fields, the one
    at fault first) that the request sets; "method" when the request sets none of them (the error is
    about the server's defaults together, or about no single setting)."""
    for name in err.fields:
        param = server_field(err.config, name)
        if param is not None and getattr(request, param, None) is not None:
            return param
    return "method"
