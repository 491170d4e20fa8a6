"""`specfill generate`: stream text from a prompt with full, H2O or speculative prefill."""
from __future__ import annotations

import argparse
import sys

from specfill.api import backend_module, format_stats, load, load_speculator, prefill_method, stream_generate
from specfill.core import ConfigError
from specfill.core.runtime import PrefillInfo

from .options import MODEL_HELP, add_method_options, h2o_config, specprefill_config
from .progress import PrefillProgressBar

HELP = "generate text (default model: the bundled SmolLM2-135M-Instruct demo)"
DEFAULT_PROMPT = "What is the capital of France?"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cuda", help="mlx or cuda (default: %(default)s)")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--method", choices=("full", "h2o", "specprefill", "auto"), default="full",
                   help="auto: full prefill below the crossover length measured for this backend and device "
                        "(results/bench/crossover.json, else 2048 tokens), above it specprefill when "
                        "--speculator is given, else h2o (default: %(default)s)")
    p.add_argument("--auto-threshold", type=int, default=None,
                   help="with --method auto: the prompt length from which the sparse method runs")
    p.add_argument("--speculator", default=None, help="speculator model path, or self:K (the first K layers)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="prompt text; '-' reads standard input")
    src.add_argument("--prompt-file", default=None, help="read the prompt from a file")
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    add_method_options(p)
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    p.add_argument("--device", default=None, help="torch device (cpu, cuda, cuda:1)")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--ignore-chat-template", action="store_true")


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                return f.read()
        except OSError as err:
            raise ConfigError(f"cannot read --prompt-file {args.prompt_file}: {err.strerror}") from None
    if args.prompt == "-":
        return sys.stdin.read()
    return args.prompt if args.prompt is not None else DEFAULT_PROMPT


def build_prompt(tokenizer, text: str, args: argparse.Namespace) -> str:
    if args.ignore_chat_template or not tokenizer.chat_template:
        return text
    messages = ([{"role": "system", "content": args.system_prompt}] if args.system_prompt else [])
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def run(args: argparse.Namespace) -> int:
    if args.auto_threshold is not None and args.method != "auto":
        raise ConfigError("--auto-threshold goes with --method auto")
    h2o, spec = h2o_config(args), specprefill_config(args)
    backend = backend_module(args.backend)  # unknown or not installed: one clear error
    if args.backend == "cuda" and not backend.cuda_available() and args.device in (None, "cuda"):
        print("specfill: no CUDA GPU found: the cuda backend runs on the CPU", file=sys.stderr)
        args.device = "cpu"
    model, tokenizer = load(args.model, backend=args.backend, dtype=args.dtype, device=args.device)
    speculator = None
    if args.method == "specprefill" or (args.method == "auto" and args.speculator is not None):
        if args.speculator is None:
            raise ConfigError("--method specprefill needs --speculator PATH or --speculator self:K")
        speculator = load_speculator(args.speculator, model, tokenizer, dtype=args.dtype, device=args.device)
    method = prefill_method(args.method, h2o=h2o, specprefill=spec, speculator=speculator,
                            auto_threshold=args.auto_threshold)
    prompt = build_prompt(tokenizer, read_prompt(args), args)
    bar = PrefillProgressBar()
    last, info = None, PrefillInfo()
    print("=" * 10)
    for last in stream_generate(model, tokenizer, prompt, args.max_tokens, temperature=args.temp,
                                top_p=args.top_p, seed=args.seed, method=method,
                                prompt_progress_callback=bar.update, prefill_info=info):
        bar.close()
        print(last.text, end="", flush=True)
    print()
    if last is not None:
        print(format_stats(last))
    if args.method == "auto":
        print(f"Method: auto -> {info.method}")
    return 0
