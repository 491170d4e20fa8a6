"""Run issue 24's fix candidates on RULER samples (evaluation/ruler_fix.py), checkpointing every
record to a JSON file so that runs cut at the 10-minute budget of a shared CPU add up:

    flock /work/model.lock timeout 600 .venv/bin/python scripts/ruler_fix.py --tasks vt --samples 0,1 \\
        --full --out results/eval/ruler/fix_runs/vt.json

Without --settings, the SpecPrefill candidates of evaluation.ruler_fix.default_settings() run;
"--settings 'h2o:' 'h2o share 0.25:memory_share=0.25'" runs H2O settings (through the API).
--full adds full prefill (the reference score and TTFT); --only-full runs nothing else.
The speculator's pass over a sample is saved under --pass-dir and reused by later runs
(--pass-only: make passes, nothing else; --selection-only: what each setting keeps on the saved
passes, no decoding and no model weights loaded).
A (task, sample, setting) already scored in the file is skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from specfill.api import load, load_speculator
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.runtime import PrefillMethod
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_fix import (SavedPass, default_settings, parse_setting, run_api,
                                           run_setting, selection_grid, speculate)
from specfill.evaluation.ruler_run import answer_budget
from specfill.evaluation.ruler_tasks import build_sample

MODELS = Path.home() / ".cache/specfill/models"


def _save(path: Path, result: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    os.replace(tmp, path)


def _setup(args) -> tuple[dict, object, object, object]:
    import torch

    torch.set_num_threads(args.threads)
    if args.selection_only:  # saved passes and the tokenizer (GGUF metadata) only: no weights, no model lock
        model = speculator = None
        tokenizer = load_tokenizer(MODELS / args.model)
    else:
        model, tokenizer = load(str(MODELS / args.model), backend="cuda", dtype="float32", device="cpu")
        speculator = load_speculator(str(MODELS / args.speculator), model, tokenizer, dtype="float32", device="cpu")
    result = json.loads(args.out.read_text()) if args.out.exists() else {"records": [], "runs": []}
    result["plan"] = {"model": args.model, "speculator": args.speculator, "backend": "cuda", "dtype": "float32",
                      "device": "cpu", "length": args.length, "seed": args.seed, "answer_tokens": args.answer_tokens}
    return result, model, tokenizer, speculator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="vt")
    parser.add_argument("--samples", default="0")
    parser.add_argument("--length", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-tokens", type=int, default=40)
    parser.add_argument("--settings", nargs="*", default=None)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--only-full", action="store_true")
    parser.add_argument("--pass-only", action="store_true")
    parser.add_argument("--grid", action="store_true", help="the wider selection grid (with --selection-only)")
    parser.add_argument("--selection-only", action="store_true")
    parser.add_argument("--pass-dir", type=Path, default=Path("/tmp/fid_passes"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--speculator", default="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = (selection_grid() if args.grid else default_settings()) if args.settings is None \
        else dict(map(parse_setting, args.settings))
    if args.only_full:
        settings = {}
    args.pass_dir.mkdir(parents=True, exist_ok=True)
    result, model, tokenizer, speculator = _setup(args)
    run = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": describe_machine()}
    result["runs"].append(run)
    done = {(r["task"], r["index"], r["setting"]) for r in result["records"] if r["score"] is not None}

    def keep(record: dict) -> None:
        key = (record["task"], record["index"], record["setting"])
        result["records"] = [r for r in result["records"] if (r["task"], r["index"], r["setting"]) != key]
        result["records"].append(record)
        if record["score"] is not None:
            done.add(key)
        run["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
        _save(args.out, result)
        print(f"{key}: score {record['score']} TTFT {record['ttft_s']} kept {record['kept_tokens']} "
              f"answer kept {record['answer_kept']} | {record['prediction'][:70]!r}", flush=True)

    for task in args.tasks.split(","):
        for index in map(int, args.samples.split(",")):
            sample = build_sample(tokenizer, task, args.length, index, args.seed, True)
            budget = answer_budget(sample, args.answer_tokens)
            if (args.full or args.only_full) and (task, index, "full") not in done and model is not None:
                keep(run_api(model, tokenizer, sample, "full", PrefillMethod("full"), budget))
            _specprefill(args, model, speculator, tokenizer, sample, settings, done, keep, budget)
            for label, config in settings.items():
                if isinstance(config, H2OConfig) and (task, index, label) not in done and model is not None \
                        and not args.pass_only:
                    keep(run_api(model, tokenizer, sample, label, PrefillMethod("h2o", h2o=config), budget))


def _specprefill(args, model, speculator, tokenizer, sample, settings, done, keep, budget) -> None:
    """The sample's saved speculator pass (made now when missing), then each SpecPrefill setting."""
    todo = {k: v for k, v in settings.items()
            if isinstance(v, SpecPrefillConfig) and (sample.task, sample.index, k) not in done}
    if not todo:
        return
    path = args.pass_dir / f"{sample.task}_{args.length}_{args.seed}_{sample.index}.npz"
    if path.exists():
        saved = SavedPass.load(path)
    elif model is None:
        print(f"{sample.task} #{sample.index}: no saved speculator pass in {args.pass_dir}", flush=True)
        return
    else:
        saved = speculate(model, speculator, tokenizer, sample, SpecPrefillConfig().lookahead)
        saved.save(path)
        print(f"{sample.task} #{sample.index}: speculator pass {saved.seconds:.1f} s", flush=True)
    if args.pass_only:
        return
    for label, config in todo.items():
        keep(run_setting(model, tokenizer, sample, saved, label, config, budget, not args.selection_only))


if __name__ == "__main__":
    main()
