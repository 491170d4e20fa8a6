"""`specfill serve`: an OpenAI- and Anthropic-compatible HTTP server (FastAPI on uvicorn) over one loaded model.

    from specfill.serve import ServerDefaults, build_app
    app = build_app(model, tokenizer, ServerDefaults(model_id="smollm2"))   # then uvicorn.run(app)

Modules: protocol (request bodies), chat (a chat request's template rendering with tools, and its
reply rules: tool_choice, response_format), plan (request -> runnable Plan, all 400s), engine (one
generation on the worker thread), scheduler (the worker thread and its bounded queue), tool_parsers
(tool calls read back from a reply: the formats, their detection, the reply's splitting; tool_calls
its pieces, tool_mlx mlx-lm's parsers, tool_harmony gpt-oss's channels, tool_stream a call's
arguments as they stream), responses (OpenAI-shaped bodies and chunks), anthropic (the
Messages API: its body -> the chat request, its bodies and events), app (generation routes,
streaming, disconnects), info (health, models, tokenize, metrics routes), metrics (log line,
Prometheus), access (API key, CORS), runner (bind before load, signals), prompt_cache (conversations'
KV reused by later prompts), prompt_store (its files: --prompt-cache-dir).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from specfill.core import ConfigError

from .access import Access
from .metrics import configure_logging
from .plan import ServerDefaults

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def read_chat_template(spec: str) -> str:
    """--chat-template: "chatml" (built in) or a Jinja file."""
    if spec == "chatml":
        return CHATML
    try:
        return Path(spec).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read --chat-template {spec}: {err.strerror}") from None


def build_app(
    model: Any,
    tokenizer: Any,
    defaults: ServerDefaults,
    *,
    max_queue: int = 8,
    cache_tokens: int | None = None,
    access: Access = Access(),
    engine: Any = None,
    cache_memory: float | None = 4.0,
    cache_dir: str | None = None,
    cache_disk: float | None = None,
    model_name: str | None = None,
    speculator_name: str | None = None,
    session: Any = None,
) -> Any:
    """The FastAPI app for a loaded (model, tokenizer) pair (imports FastAPI only when called).

    access: the API key and CORS origins (default: no key, no cross-origin calls).
    cache_memory: the prompt cache's bound, GB of KV (None: none); cache_tokens: a bound on its
    conversation tokens too (None: none); cache_dir: its disk store (None: none), bounded by
    cache_disk GB (None: cache_memory's); model_name: the model's identity in the store's files
    (default: defaults.model_id); speculator_name: the --speculator spec, its speculator KV files'
    identity (the store keeps the SpecPrefill speculator's KV of each conversation too). With
    defaults.prompt_cache "off" the server has no prompt cache.
    engine: a ready Engine (serve/distributed.py's LeaderEngine, rank 0 under mlx.launch) with its own
    prompt cache (memory-bounded, no disk store); None: one made here, generating through `session`:
    the specfill.open Session that loaded model and tokenizer (the CLI's), None: Session(model, tokenizer).
    """
    from specfill.api import Session
    from specfill.backends import get_backend

    from .app import create_app
    from .engine import Engine
    from .prompt_cache import PromptCache

    if max_queue < 1:  # queue.Queue(0) would be unbounded
        raise ConfigError(f"--max-queue must be >= 1, got {max_queue}")
    if cache_tokens is not None and cache_tokens < 1:
        raise ConfigError(f"--cache-tokens must be >= 1, got {cache_tokens}")
    for flag, value in (("--cache-memory", cache_memory), ("--cache-disk", cache_disk)):
        if value is not None and not 0 < value < math.inf:  # NaN too
            raise ConfigError(f"{flag} must be a finite number of GB > 0, got {value}")
    if defaults.prompt_cache not in ("exact", "approximate", "off"):
        raise ConfigError(f"--prompt-cache must be exact, approximate or off, got {defaults.prompt_cache!r}")
    if engine is not None:
        if cache_dir is not None:
            raise ConfigError(
                "--prompt-cache-dir is not supported under mlx.launch yet (each rank keeps its own "
                "prompt cache in memory)"
            )
        return create_app(engine, defaults, max_queue=max_queue, access=access)
    cache = None
    if defaults.prompt_cache != "off":
        store = None
        if cache_dir is not None:
            from .prompt_store import PromptStore

            disk = cache_disk if cache_disk is not None else cache_memory
            try:
                store = PromptStore(
                    cache_dir,
                    model,
                    model_name or defaults.model_id,
                    None if disk is None else int(disk * 1e9),
                    defaults.speculator,
                    speculator_name,
                )
            except OSError as err:
                raise ConfigError(f"cannot use --prompt-cache-dir {cache_dir}: {err.strerror or err}") from None
        cache = PromptCache(
            cache_tokens,
            model.args.max_position_embeddings,
            None if cache_memory is None else int(cache_memory * 1e9),
            store,
            background=get_backend(model.backend).threaded_writes,
        )
        cache.use_speculator(model, defaults.speculator)  # its KV of each SpecPrefill conversation, built up
    session = Session(model, tokenizer) if session is None else session
    return create_app(Engine(session, cache), defaults, max_queue=max_queue, access=access)


__all__ = ["CHATML", "Access", "ServerDefaults", "build_app", "configure_logging", "read_chat_template"]
