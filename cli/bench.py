"""`specfill bench`: TTFT and decode tokens/s vs prompt length, ratios against full prefill."""

from __future__ import annotations

import argparse

from specfill.api import DEFAULT_BACKEND_RULE, default_backend
from specfill.core import ConfigError
from specfill.evaluation.bench import BENCH_METHODS, BenchPlan, run_bench, write_bench
from specfill.evaluation.drafting import DraftingPlan, run_drafting_bench, write_drafting
from specfill.evaluation.drafting_ratios import DEFAULT_PROMPTS, RatioPlan, run_drafting_ratios, write_drafting_ratios

from .options import MODEL_HELP, add_method_options, int_list, plan_settings, specprefill_config, str_list
from .progress import run_written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backends", type=str_list, default=None, help=f"comma list: mlx,cuda (default: one, {DEFAULT_BACKEND_RULE})"
    )
    p.add_argument(
        "--methods",
        type=str_list,
        default=["full", "h2o", "specprefill"],
        help=f"comma list of {', '.join(BENCH_METHODS)} (specprefill+h2o: SpecPrefill over an H2O speculator; "
        "auto: what method auto runs on this machine, calibrated before the clock) (default: %(default)s)",
    )
    p.add_argument("--lengths", type=int_list, default=[2000, 4000, 8000], help="comma list of prompt lengths")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--speculator", default="self:8", help="speculator path or self:K (default: %(default)s)")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per row, the methods of a length in turn round after round (the best reported, each run listed)",
    )
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="results/bench", help="folder for bench.json/.md/_ttft.png")
    p.add_argument("--name", default="bench", help="file name stem (default: %(default)s)")
    p.add_argument(
        "--save-crossover",
        action="store_true",
        help="make this bench's crossovers what method auto uses on this machine (default: the "
        "bench only re-runs auto's short calibration)",
    )
    p.add_argument(
        "--draft-tokens",
        type=int_list,
        default=None,
        help="speculative decoding instead: decode tok/s with k = 0 and each of these draft sizes "
        "(one prompt of the first --lengths tokens, --decode-tokens new tokens; see --draft-model)",
    )
    p.add_argument(
        "--prompt-file",
        default=None,
        help="with --draft-tokens: the prompt's text (default: the "
        "evaluation text); its first --lengths tokens are used",
    )
    p.add_argument(
        "--draft-model",
        default="self:8",
        help="the draft after full prefill (path or self:K); after "
        "SpecPrefill the --speculator drafts (default: %(default)s)",
    )
    p.add_argument(
        "--draft-ratios",
        action="store_true",
        help="end-to-end time drafted / plain with the default drafting and --draft-model, per dtype (--dtype, "
        "else float32 and bfloat16), prompt (--ratio-prompts, cut to the first --lengths tokens) and reply "
        "length (--reply-tokens), each row run max(--repeats, 2) times, the last judged",
    )
    p.add_argument(
        "--ratio-prompts",
        type=str_list,
        default=[f"{kind}={path}" for kind, path in DEFAULT_PROMPTS],
        help="with --draft-ratios: comma list of KIND=TEXT_FILE (default: %(default)s)",
    )
    p.add_argument(
        "--reply-tokens",
        type=int_list,
        default=[32, 256],
        help="with --draft-ratios: max_tokens per row (default: 32,256)",
    )
    add_method_options(p)


def run(args: argparse.Namespace) -> int:
    for name in args.methods:
        if name not in BENCH_METHODS:
            raise ConfigError(f"unknown method {name!r} ({', '.join(BENCH_METHODS)})")
    if args.decode_tokens < 1 or args.repeats < 1 or any(n < 1 for n in args.lengths):
        raise ConfigError("--decode-tokens, --repeats and --lengths must be positive")
    plan = BenchPlan(
        backends=_backends(args),
        methods=tuple(args.methods),
        lengths=tuple(args.lengths),
        **plan_settings(args),
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
        device=args.device,
        save_crossover=args.save_crossover,
    )
    if args.draft_tokens is not None:
        return run_drafting(args)
    if args.draft_ratios:
        return run_ratios(args)
    return run_written(
        "bench",
        lambda bar, save: run_bench(plan, log=bar.log, step=bar.step, row_done=save),
        lambda result: write_bench(result, args.out, args.name),
    )


def _backends(args: argparse.Namespace) -> tuple[str, ...]:
    """--backends, else the platform's default backend."""
    return tuple(args.backends or [default_backend()])


def _drafted(args: argparse.Namespace) -> dict:
    """What both drafting runs take from the flags alike: the first backend, the model, its draft
    model, the prompt's length and the device."""
    return {
        "backend": _backends(args)[0],
        "model": args.model,
        "draft": args.draft_model,
        "prompt_tokens": args.lengths[0],
        "device": args.device,
    }


def run_drafting(args: argparse.Namespace) -> int:
    """`--draft-tokens`: decode speed with and without speculative decoding (evaluation/drafting.py)."""
    if any(k < 1 for k in args.draft_tokens):
        raise ConfigError("--draft-tokens must be positive")
    plan = DraftingPlan(
        **_drafted(args),
        speculator=args.speculator,
        methods=tuple(m for m in args.methods if m in ("full", "specprefill")),
        draft_tokens=tuple(args.draft_tokens),
        decode_tokens=args.decode_tokens,
        specprefill=specprefill_config(args),
        dtype=args.dtype,
        prompt_file=args.prompt_file,
    )
    for path in write_drafting(run_drafting_bench(plan), args.out, args.name):
        print(path)
    return 0


def run_ratios(args: argparse.Namespace) -> int:
    """`--draft-ratios`: drafting against plain decoding end to end (evaluation/drafting_ratios.py)."""
    prompts = tuple(tuple(item.split("=", 1)) for item in args.ratio_prompts)
    if any(len(p) != 2 or not all(p) for p in prompts):
        raise ConfigError("--ratio-prompts takes KIND=TEXT_FILE items")
    if any(n < 2 for n in args.reply_tokens):
        raise ConfigError("--reply-tokens must be at least 2 (a reply of one token drafts nothing)")
    plan = RatioPlan(
        **_drafted(args),
        prompts=prompts,
        reply_tokens=tuple(args.reply_tokens),
        dtypes=(args.dtype,) if args.dtype else ("float32", "bfloat16"),
        runs=max(args.repeats, 2),
    )
    name = args.name if args.name != "bench" else "drafting_ratios"
    write = lambda partial: write_drafting_ratios(partial, args.out, name)  # noqa: E731
    for path in write(run_drafting_ratios(plan, row_done=write)):
        print(path)
    return 0
