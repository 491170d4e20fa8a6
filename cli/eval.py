"""`specfill eval`: perplexity, passkey retrieval and RULER's tasks for full, H2O and speculative prefill."""

from __future__ import annotations

import argparse

from specfill.api import resolve_backend
from specfill.core import ConfigError
from specfill.evaluation.eval_report import write_eval
from specfill.evaluation.quality import RETRIEVAL_TASKS, EvalPlan, run_eval
from specfill.evaluation.ruler_data import RulerDataMissing, ruler_available
from specfill.evaluation.ruler_tasks import DEFAULT_RULER_TASKS, RULER_TASKS, expand_tasks

from .options import (
    add_method_options,
    add_model_options,
    float_list,
    h2o_config,
    int_list,
    specprefill_config,
    str_list,
)
from .progress import WorkProgressBar, run_written


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument(
        "--tasks",
        type=str_list,
        default=["perplexity", "passkey"],
        help="comma list of perplexity, passkey, multikey (four named numbers hidden in the evaluation "
        "text, one asked; lengths from --passkey-lengths), RULER's tasks ("
        + ", ".join(RULER_TASKS)
        + "; lengths from --ruler-lengths; needs the 'ruler' extra) or ruler (= "
        + ",".join(DEFAULT_RULER_TASKS)
        + "); default: perplexity,passkey",
    )
    p.add_argument("--methods", type=str_list, default=["full", "h2o", "specprefill"])
    p.add_argument("--perplexity-lengths", type=int_list, default=[4000, 8000])
    p.add_argument(
        "--passkey-lengths",
        type=int_list,
        default=[2000, 4000, 8000],
        help="prompt lengths of the retrieval tasks (passkey, multikey)",
    )
    p.add_argument(
        "--trials", type=int, default=20, help="retrieval trials (RULER: samples) per task, length and method"
    )
    p.add_argument(
        "--ruler-lengths",
        type=int_list,
        default=[4000],
        help="prompt lengths in tokens (at most; chat template included) of RULER's tasks",
    )
    p.add_argument("--ruler-seed", type=int, default=0, help="seed of RULER's samples (each method sees the same)")
    p.add_argument(
        "--ruler-first-sample",
        type=int,
        default=0,
        help="index of the first RULER sample (runs of other methods or more samples add to a run's)",
    )
    p.add_argument(
        "--answer-tokens",
        type=int,
        default=None,
        help="cap on RULER's answer budgets (niah 128, vt 30, cwe 120, qa 32 tokens); generation stops "
        "earlier once every expected string is found",
    )
    p.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="RULER prompts as plain text (default: in the model's chat template when it has one)",
    )
    p.add_argument("--keeps", type=float_list, default=[0.1, 0.3], help="SpecPrefill keep ratios to evaluate")
    p.add_argument("--speculator", default="self:8")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    p.add_argument("--device", default=None)
    p.add_argument(
        "--candidates",
        nargs="+",
        default=None,
        metavar="NAME[:key=value,...]",
        help="RULER selection protocol: compare these settings on saved speculator passes instead of the "
        "method sweep. Each is 'full', 'h2o...:' + H2OConfig fields, any other name + SpecPrefillConfig "
        "fields (e.g. 'mean 0.2:keep_ratio=0.2,layer_reduction=mean'; a name with '+h2o' or keys "
        "'h2o_FIELD=...' (the speculator's H2OConfig): SpecPrefill over an H2O speculator), 'defaults' (full and each "
        "method's default) or 'grid' (the built-in SpecPrefill candidates); docs/eval.md",
    )
    p.add_argument(
        "--selection-only",
        action="store_true",
        help="with --candidates: what each SpecPrefill candidate (+h2o ones included) keeps of the answer spans, "
        "no main-model prefill or decoding",
    )
    p.add_argument(
        "--end-to-end",
        action="store_true",
        help="with --candidates: decode SpecPrefill candidates through the API, one speculator pass each "
        "(TTFT measured in one call; default: from the saved pass)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="speculator passes and full-prefill answers kept between runs "
        "(default: <specfill cache>/eval: $SPECFILL_CACHE, else ~/.cache/specfill)",
    )
    p.add_argument("--out", default="results/eval")
    p.add_argument("--name", default="eval")
    add_method_options(p, sweep=True)


def _check_tasks(args: argparse.Namespace) -> list[str]:
    """The tasks with `ruler` expanded; ConfigError for unknown names or bad numbers,
    RulerDataMissing when a RULER task is asked for without its data packages."""
    tasks = expand_tasks(args.tasks)
    known = {"perplexity", *RETRIEVAL_TASKS, *RULER_TASKS}
    unknown = set(tasks) - known | set(args.methods) - {"full", "h2o", "specprefill"}
    if unknown:
        raise ConfigError(f"unknown task or method: {', '.join(sorted(unknown))}")
    if args.trials < 1:
        raise ConfigError("--trials must be >= 1")
    if any(n < 1 for n in args.ruler_lengths) or (args.answer_tokens is not None and args.answer_tokens < 1):
        raise ConfigError("--ruler-lengths and --answer-tokens must be >= 1")
    if args.ruler_first_sample < 0:
        raise ConfigError("--ruler-first-sample must be >= 0")
    if set(tasks) & set(RULER_TASKS) and ruler_available() is not None:
        raise RulerDataMissing(ruler_available())
    return tasks


def run(args: argparse.Namespace) -> int:
    tasks = _check_tasks(args)
    if args.candidates is not None or args.selection_only or args.end_to_end:
        return _run_protocol(args, tasks)
    for keep in args.keeps:  # validates every swept setting up front
        for rule in args.score_layers:
            specprefill_config(args, keep_ratio=keep, layers=rule)
    for tail in args.h2o_dense_tail:
        h2o_config(args, dense_tail=tail)
    backend = resolve_backend(args.backend)
    plan = EvalPlan(
        backend=backend,
        model=args.model,
        tasks=tuple(tasks),
        methods=tuple(args.methods),
        perplexity_lengths=tuple(args.perplexity_lengths),
        passkey_lengths=tuple(args.passkey_lengths),
        trials=args.trials,
        keeps=tuple(args.keeps),
        speculator=args.speculator,
        dense_tails=tuple(args.h2o_dense_tail),
        score_layers=tuple(args.score_layers),
        h2o=h2o_config(args, dense_tail=args.h2o_dense_tail[0]),
        specprefill=specprefill_config(args, layers=args.score_layers[0]),
        dtype=args.dtype,
        device=args.device,
        ruler_lengths=tuple(args.ruler_lengths),
        ruler_seed=args.ruler_seed,
        ruler_first=args.ruler_first_sample,
        chat_template=not args.ignore_chat_template,
        answer_tokens=args.answer_tokens,
    )
    return run_written(
        "eval",
        lambda bar, save: run_eval(plan, log=bar.log, step=bar.step, cell_done=save),
        lambda result: write_eval(result, args.out, args.name),
    )


def _run_protocol(args: argparse.Namespace, tasks: list[str]) -> int:
    """`--candidates`: evaluation/ruler_protocol.py on the RULER tasks, results written as they come."""
    from pathlib import Path

    from specfill.core.io.demo_model import cache_dir
    from specfill.evaluation.machine import default_eval_dtype, describe_machine
    from specfill.evaluation.ruler_protocol import ProtocolPlan, resolve_candidates, run_protocol, selected_alone
    from specfill.evaluation.ruler_protocol_report import write_protocol_report

    if args.candidates is None:
        raise ConfigError("--selection-only and --end-to-end go with --candidates")
    if set(tasks) - set(RULER_TASKS):
        raise ConfigError(f"--candidates runs RULER tasks only, not {', '.join(sorted(set(tasks) - set(RULER_TASKS)))}")
    if args.model is None:
        raise ConfigError("--candidates needs --model (the main model the speculator's choices are for)")
    candidates = resolve_candidates(args.candidates)
    backend = resolve_backend(args.backend)
    cache = Path(args.cache_dir) if args.cache_dir else cache_dir() / "eval"
    plan = ProtocolPlan(
        model=args.model,
        speculator=args.speculator,
        backend=backend,
        dtype=args.dtype or default_eval_dtype(backend, args.device),
        device=args.device,
        tasks=tuple(tasks),
        lengths=tuple(args.ruler_lengths),
        candidates=candidates,
        trials=args.trials,
        first=args.ruler_first_sample,
        seed=args.ruler_seed,
        chat_template=not args.ignore_chat_template,
        answer_tokens=args.answer_tokens,
        selection_only=args.selection_only,
        end_to_end=args.end_to_end,
        cache_dir=cache,
    )
    out = Path(args.out)
    per_sample = sum(1 for c in candidates.values() if not args.selection_only or selected_alone(c))
    total = len(plan.lengths) * len(plan.tasks) * plan.trials * per_sample

    def step(label: str) -> None:
        bar.log(label)
        bar.step(total, label[:60])

    with WorkProgressBar("eval") as bar:
        result = run_protocol(plan, out / f"{args.name}.json", log=bar.log, step=step, machine=describe_machine())
    for path in [out / f"{args.name}.json", *write_protocol_report(result, out, args.name)]:
        print(path)
    return 0
