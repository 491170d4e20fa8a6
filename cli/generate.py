"""`specfill generate`: stream text from a prompt with full, H2O or speculative prefill."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

from specfill.api import format_stats
from specfill.core import SpecfillWarning
from specfill.core.request import GenerationRequest, build_request, find
from specfill.core.runtime import GenerationInfo
from specfill.generation import calibrate_for_prompt, encode_prompt

from .options import (
    add_method_options,
    add_model_options,
    add_sampling_options,
    add_setting_option,
    h2o_config,
    open_model,
    sampling_options,
    specprefill_config,
    warn_unused_options,
)
from .progress import PrefillProgressBar

if TYPE_CHECKING:
    from specfill.api import Session

DEFAULT_PROMPT = "What is the capital of France?"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument(
        "--model-file",
        default=None,
        help="the GGUF file of a repo-id --model (as llama.cpp's --hf-file); same as owner/repo:FILE",
    )
    p.add_argument(
        "--download",
        action="store_true",
        help="fetch a repo-id --model from the Hugging Face Hub when it is not cached (never when HF_HUB_OFFLINE=1)",
    )
    method = find("PrefillMethod", "name")
    add_setting_option(p, method, choices=method.choices)  # auto: docs/methods.md#auto
    add_setting_option(p, find("PrefillMethod", "auto_threshold"))
    add_setting_option(p, find("PrefillMethod", "speculator"))
    add_setting_option(p, find("Drafting", "model"))
    add_setting_option(p, find("Drafting", "num_tokens"), default=None)  # none given: no drafting
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="prompt text; '-' reads standard input")
    src.add_argument("--prompt-file", default=None, help="read the prompt from a file")
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    add_sampling_options(p, basic=True)
    add_method_options(p)
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    p.add_argument("--device", default=None, help="torch device (cpu, cuda, cuda:1)")
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="under mlx.launch (more than one rank): split the model's layers over the ranks "
        "(mlx-lm's pipeline parallelism) instead of its heads (tensor parallelism)",
    )
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--ignore-chat-template", action="store_true")


def read_prompt(args: argparse.Namespace) -> str:
    """--prompt-file (a pipe such as <(...) works too), standard input for '-', else --prompt;
    the bytes must be UTF-8 text."""
    if args.prompt_file is None and args.prompt != "-":
        return args.prompt if args.prompt is not None else DEFAULT_PROMPT
    from specfill.prompts import decode_utf8, read_prompt_file  # text from a file or a pipe only

    if args.prompt_file is not None:
        return read_prompt_file(args.prompt_file)
    return decode_utf8(sys.stdin.buffer.read(), "standard input")


def _for_method(build: Callable[[argparse.Namespace], Any], args: argparse.Namespace, method: str) -> Any:
    """The method's config when args.method is `method`, else None; its values are checked
    either way (a malformed --keep is an error even with --method full), its clamps warn only
    where it is used."""
    if args.method == method:
        return build(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecfillWarning)
        build(args)
    return None


def _defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return parser.parse_args([])


def build_prompt(tokenizer, text: str, args: argparse.Namespace) -> str:
    if args.ignore_chat_template or not tokenizer.chat_template:
        return text
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def cli_request(args: argparse.Namespace) -> GenerationRequest:
    """The flags as one request (core/request.py), checked before any model loads; a method's
    flags are checked even when another method runs (a malformed --keep is an error with
    --method full too), and flags another method ignores get one warning."""
    h2o, spec = _for_method(h2o_config, args, "h2o"), _for_method(specprefill_config, args, "specprefill")
    warn_unused_options(args, _defaults())
    auto = args.method == "auto"
    return build_request(
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_p=args.top_p,
        seed=args.seed,
        **sampling_options(args),
        method=args.method,
        h2o=h2o if args.method in ("h2o", "auto") else None,
        specprefill=spec if args.method in ("specprefill", "auto") else None,
        speculator=args.speculator if args.method == "specprefill" or auto else None,
        auto_threshold=args.auto_threshold,
        draft_model=args.draft_model,
        num_draft_tokens=args.num_draft_tokens,
    )


def _calibrate_for_prompt(session: Session, ids: list[int], request: GenerationRequest) -> None:
    """--method auto: the calibrations its choice reads, measured before the clock where none is kept
    (generation.calibrate_for_prompt; one process: a sharded model's ranks calibrate in the request),
    each announced on stderr, and how long they took."""
    told: list[str] = []

    def tell(line: str) -> None:
        told.append(line)
        print(f"specfill: {line}", file=sys.stderr, flush=True)

    began = time.perf_counter()
    calibrate_for_prompt(session.model, session.tokenizer, ids, request, tell)
    if told:
        from specfill.core.crossover import calibration_dir  # loaded where auto measured: full prefill loads none

        seconds = time.perf_counter() - began
        said = f"specfill: auto: calibrated in {seconds:.1f} s, kept in {calibration_dir()} (not in the TTFT below)"
        print(said, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    request = cli_request(args)  # every flag checked before any model loads
    prompt_text = read_prompt(args)
    # the backend and device rules, mlx.launch's ranks, the model
    session = open_model(args, model_file=args.model_file, download=args.download)
    ids = encode_prompt(session.tokenizer, build_prompt(session.tokenizer, prompt_text, args))  # encoded once
    request = session.prepare(request)  # its speculator loaded: what auto's calibrations time
    _calibrate_for_prompt(session, ids, request)
    last, info = None, GenerationInfo()
    bar = PrefillProgressBar(info=info)  # the whole time to first token, every prefill stage weighted
    say = print if session.leads else (lambda *_, **__: None)  # every rank generates alike; rank 0 prints
    say("=" * 10)
    progress = bar.update if session.leads else None
    for last in session.stream(ids, request, prompt_progress_callback=progress, prefill_info=info):
        bar.close()
        say(last.text, end="", flush=True)
    say()
    if last is not None:
        say(format_stats(last, args.method))
    return 0
