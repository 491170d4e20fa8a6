"""`specfill serve`: an OpenAI-compatible server (FastAPI on uvicorn) with per-request prefill control."""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from specfill.api import Session, launched_group
from specfill.core import (
    BackendUnavailableError,
    ConfigError,
    H2OConfig,
    SpecfillError,
    SpecfillWarning,
    SpecPrefillConfig,
)
from specfill.core.request import build_request, find

from . import options

# On purpose smaller than the core's DEFAULT_PREFILL_STEP_SIZE (2048, mlx-lm's, which `generate` and the
# API use): the server sends a progress event and notices a client gone or a shutdown after each step,
# so its step is that granularity too (llama.cpp's server default, -ub 512)
SERVER_PREFILL_STEP_SIZE = 512


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.add_model_options(p)
    p.add_argument(
        "--served-model-name",
        "--model-id",
        dest="served_model_name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the name(s) requests use and /v1/models reports; other names get 404 "
        "(default: the repo id, or the file name without its extension)",
    )
    p.add_argument(
        "--served-model-pattern",
        dest="served_model_pattern",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="further model names requests may use, as shell-style patterns (e.g. 'claude-*': the names "
        "a coding agent asks for on its own, such as Claude Code's small model); not listed by /v1/models, "
        "answered as the first served name (default: none)",
    )
    method = find("PrefillMethod", "name")  # the settings table's choices and default, auto included
    options.add_setting_option(p, method, choices=method.choices, help=f"{method.help}; for requests that name none")
    p.add_argument(
        "--speculator", default=None, help="speculator model path, or self:K; needed for specprefill requests"
    )
    options.add_method_options(p)
    options.add_sampling_options(p)  # the defaults of requests that set none of these fields
    p.add_argument(
        "--prefill-step-size",
        type=int,
        default=SERVER_PREFILL_STEP_SIZE,
        help="tokens per full-prefill step, and per step of the speculator's pass (SpecPrefill): the "
        "server sends a progress event and notices a client gone or a shutdown after each step "
        "(H2O steps by its logical batch -b); default %(default)s, as llama.cpp's -ub",
    )
    p.add_argument(
        "--max-tokens",
        "-m",
        type=int,
        default=512,
        help="tokens generated when a request sets no max_tokens (default: %(default)s)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=8,
        help="requests that may wait behind the running one; more get 503 (default: %(default)s)",
    )
    p.add_argument(
        "--prompt-cache",
        choices=("exact", "approximate", "off"),
        default="exact",
        help="multi-turn KV reuse: exact (sparse caches rebuilt densely first), approximate (reused "
        "as they are) or off; requests may choose too (default: %(default)s)",
    )
    p.add_argument(
        "--cache-memory",
        type=float,
        default=4.0,
        metavar="GB",
        help="prompt cache bound: GB of KV kept in memory in all, least recently used evicted (default: %(default)s)",
    )
    p.add_argument(
        "--cache-tokens",
        type=int,
        default=None,
        help="prompt cache bound besides --cache-memory: conversation tokens kept in memory in all (default: none)",
    )
    p.add_argument(
        "--prompt-cache-dir",
        default=None,
        metavar="DIR",
        help="also keep the prompt cache's conversations in DIR (written after their responses), "
        "reused by a restarted server of the same model (default: memory only)",
    )
    p.add_argument(
        "--cache-disk",
        type=float,
        default=None,
        metavar="GB",
        help="bound on --prompt-cache-dir's files, oldest deleted first (default: --cache-memory)",
    )
    p.add_argument(
        "--chat-template", default=None, help="Jinja file, or 'chatml', for models without a chat template of their own"
    )
    p.add_argument(
        "--chat-template-kwargs",
        default=None,
        metavar="JSON",
        help="more variables for the chat template, as a JSON object (llama.cpp's flag), e.g. "
        "'{\"enable_thinking\": false}' for Qwen3; a request's chat_template_kwargs override them",
    )
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    p.add_argument("--device", default=None, help="torch device (cpu, cuda, cuda:1)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port (default: %(default)s)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SPECFILL_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health (default: "
        "$SPECFILL_API_KEY; none: no check)",
    )
    p.add_argument(
        "--allowed-origins",
        default="",
        type=lambda text: [o.strip() for o in text.split(",") if o.strip()],
        help="comma list of browser origins allowed by CORS, or '*' (default: none)",
    )
    p.add_argument(
        "--no-lazy-grammar",
        action="store_true",
        help="tool_choice auto: leave calls unconstrained (decoded on the device, drafting kept) unless a "
        "request asks lazy_grammar: true; by default each call is constrained from its opening on",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="under mlx.launch (more than one rank): split the model's layers over the ranks "
        "(mlx-lm's pipeline parallelism) instead of its heads; rank 0 serves HTTP",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="server log: info shows one line per request (default: %(default)s)",
    )


def _server_modules() -> Any:
    """specfill.serve with its runner, or BackendUnavailableError when FastAPI / uvicorn are missing."""
    try:
        import fastapi  # noqa: F401 - checked here so the error names it before the model loads
        import uvicorn  # noqa: F401

        import specfill.serve as serve
        import specfill.serve.runner  # noqa: F401
    except ModuleNotFoundError as err:
        raise BackendUnavailableError(
            f"specfill serve needs {err.name!r}, which is not installed (pip install 'specfill[serve]')"
        ) from None
    return serve


def served_name(spec: str | None) -> str:
    """The default served model name: a file's name without its extension, a directory's name, a
    repo id without its :FILE / :QUANT tail, or the spec itself (random:SHAPE)."""
    if spec is None:
        return "SmolLM2-135M-Instruct"
    path = Path(spec).expanduser()
    if path.is_file():
        return path.stem
    if path.is_dir():
        return path.resolve().name
    if spec.startswith("random:"):
        return spec
    return spec.split(":", 1)[0]


def check_cache_bounds(args: argparse.Namespace) -> None:
    """The prompt cache's bounds, before the model loads (build_app checks them again)."""
    if args.cache_tokens is not None and args.cache_tokens < 1:
        raise ConfigError(f"--cache-tokens must be >= 1, got {args.cache_tokens}")
    for flag, value in (("--cache-memory", args.cache_memory), ("--cache-disk", args.cache_disk)):
        if value is not None and not 0 < value < math.inf:  # NaN too
            raise ConfigError(f"{flag} must be a finite number of GB > 0, got {value}")


def template_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--chat-template-kwargs as an object whose keys are not the variables the server sets, or one ConfigError."""
    from specfill.serve.chat import TEMPLATE_VARIABLES

    if args.chat_template_kwargs is None:
        return {}
    try:
        value = json.loads(args.chat_template_kwargs)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--chat-template-kwargs must be a JSON object: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--chat-template-kwargs must be a JSON object, got {type(value).__name__}")
    if taken := sorted(value.keys() & TEMPLATE_VARIABLES):
        raise ConfigError(f"--chat-template-kwargs: the server sets the template's {taken[0]}")
    return value


def run(args: argparse.Namespace) -> int:
    serve = _server_modules()
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.prefill_step_size < 1:
        raise ConfigError(f"--prefill-step-size must be >= 1, got {args.prefill_step_size}")
    check_cache_bounds(args)
    variables = template_kwargs(args)  # a bad object fails before the model loads
    h2o, spec = options.h2o_config(args), options.specprefill_config(args)
    with warnings.catch_warnings():  # requests may pick any method: the defaults of each are the server's
        warnings.simplefilter("ignore", SpecfillWarning)
        build_request(
            max_tokens=args.max_tokens,
            **options.sampling_options(args),
            method=args.method,
            h2o=h2o,
            specprefill=spec,
            speculator=args.speculator,
        )  # the default request's checks, before loading
    group = launched_group(args.backend)  # under mlx.launch: rank 0 serves, the others follow it (open: --pipeline)
    if group is not None and group.rank() != 0:
        return _follow(args)
    serve.configure_logging(args.log_level)
    sock = serve.runner.bind(args.host, args.port)  # before the model loads: a port in use fails at once
    if not serve.runner.is_loopback(args.host) and not args.api_key:
        print(
            f"specfill: WARNING: listening on {args.host} (beyond this machine) with no API key: anyone on the "
            f"network can use this server; set --api-key or SPECFILL_API_KEY",
            file=sys.stderr,
            flush=True,
        )
    try:
        return _serve(args, serve, sock, h2o, spec, variables, group)
    finally:
        sock.close()


def _load(args: argparse.Namespace) -> tuple[Session, int | None]:
    """(the session: model, tokenizer and speculator, the speculator's context): the same on every rank."""
    # the backend and device rules, mlx.launch's ranks (--pipeline), the speculator once; prefill_step_size:
    # progress and cancellation granularity
    session = options.open_model(args, speculator=args.speculator, prefill_step_size=args.prefill_step_size)
    speculator = session.speculator
    spec_context = (
        None if speculator is None or isinstance(speculator, str) else speculator.args.max_position_embeddings
    )
    return session, spec_context


def _calibrate_auto(session: Session, h2o: H2OConfig, spec: SpecPrefillConfig) -> None:
    """--method auto: auto's calibrations on this machine for the server's settings, measured before
    the server listens (or read from their cache) rather than inside the first long request
    (core/probe.calibrate_auto); one line of what auto runs where. A failure leaves it to the requests."""
    from specfill.core.crossover import calibration_dir
    from specfill.core.probe import calibrate_auto

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecfillWarning)
        method = build_request(
            max_tokens=1, method="auto", h2o=h2o, specprefill=spec, speculator=session.speculator
        ).method  # what a request that names no method runs (serve/plan.py)
    print(
        f"specfill: auto: calibrating on this machine, or reading what {calibration_dir()} holds",
        file=sys.stderr,
        flush=True,
    )

    def announce(line: str) -> None:  # each option's probe as it starts: a first start takes minutes on a CPU
        print(f"specfill: {line}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    try:
        lines = calibrate_auto(session.model, method, announce)
    except SpecfillError as err:
        print(f"specfill: auto's calibration failed ({err}); requests calibrate it", file=sys.stderr, flush=True)
        return
    took = time.perf_counter() - started
    print(f"specfill: auto on this machine: {'; '.join(lines)} ({took:.1f} s)", file=sys.stderr, flush=True)


def _channel(model: Any, speculator: Any) -> Any:
    """Rank 0's messages to the others; the loaded speculator travels as a reference to each rank's own."""
    from specfill.serve.distributed import Channel

    return Channel(model, [] if speculator is None or isinstance(speculator, str) else [speculator])


def _follow(args: argparse.Namespace) -> int:
    """Every rank but 0 under mlx.launch: load alike, then do what rank 0 does (serve/distributed.py)."""
    from specfill.serve.distributed import engine_for, follow

    session, _ = _load(args)
    if args.chat_template is not None:
        session.tokenizer.chat_template = _server_modules().read_chat_template(args.chat_template)
    engine = engine_for(session, args.prompt_cache, args.cache_tokens, None, args.cache_memory)
    return follow(engine, _channel(session.model, session.speculator))


def _serve(
    args: argparse.Namespace,
    serve: Any,
    sock: socket.socket,
    h2o: H2OConfig,
    spec: SpecPrefillConfig,
    variables: dict[str, Any],
    group: Any = None,
) -> int:
    """Load, build the app, serve on the bound socket until a signal (variables: --chat-template-kwargs)."""
    session, spec_context = _load(args)
    model, tokenizer, speculator = session.model, session.tokenizer, session.speculator
    if args.method == "auto" and group is None:  # under mlx.launch a request calibrates on every rank alike
        _calibrate_auto(session, h2o, spec)
    if args.chat_template is not None:
        tokenizer.chat_template = serve.read_chat_template(args.chat_template)
    names = tuple(args.served_model_name or (served_name(args.model),))
    defaults = serve.ServerDefaults(
        model_id=names[0],
        model_names=names,
        model_patterns=tuple(args.served_model_pattern),
        method=args.method,
        h2o=h2o,
        specprefill=spec,
        speculator=speculator,
        speculator_context=spec_context,
        max_tokens=args.max_tokens,
        prompt_cache=args.prompt_cache,
        sampling=options.sampling_options(args),
        lazy_grammar=not args.no_lazy_grammar,
        chat_template_kwargs=variables,
    )
    access = serve.Access(api_key=args.api_key or None, allowed_origins=tuple(args.allowed_origins))
    leader = None
    if group is not None:  # rank 0 of several: its engine tells the others what to do
        from specfill.serve.distributed import engine_for

        channel = _channel(model, speculator)
        leader = engine_for(session, args.prompt_cache, args.cache_tokens, channel, args.cache_memory)
    app = serve.build_app(
        model,
        tokenizer,
        defaults,
        max_queue=args.max_queue,
        cache_tokens=args.cache_tokens,
        access=access,
        engine=leader,
        cache_memory=args.cache_memory,
        cache_dir=args.prompt_cache_dir,
        cache_disk=args.cache_disk,
        model_name=args.model or names[0],
        speculator_name=args.speculator,
        session=session,
    )
    where = "" if group is None else f", {model.distributed.describe()}"
    print(
        f"specfill: serving {names[0]} ({model.backend}, {model.device_name}{where}) on http://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    try:
        serve.runner.run(app, sock, log_level=args.log_level)
    finally:
        if leader is not None:
            leader.stop_followers()
    return 0
