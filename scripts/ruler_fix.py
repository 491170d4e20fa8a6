"""Run issue 24's fix candidates on RULER samples (evaluation/ruler_fix.py), checkpointing every
record to a JSON file so that runs cut at the 10-minute budget of a shared CPU add up:

    flock /work/model.lock timeout 600 .venv/bin/python scripts/ruler_fix.py --tasks vt --samples 0,1 \\
        --full --out results/eval/ruler/fix_runs/vt.json

Without --settings, the SpecPrefill candidates of evaluation.ruler_fix.default_settings() run;
"--settings 'h2o:' 'h2o share 0.25:memory_share=0.25'" runs H2O settings (through the API).
--full adds full prefill (the reference score and TTFT); --only-full runs nothing else.
A (task, sample, setting) already in the file is skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from specfill.api import load, load_speculator
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.runtime import PrefillMethod
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_fix import default_settings, parse_setting, resolve_budget, run_api, run_specprefill
from specfill.evaluation.ruler_tasks import build_sample

MODELS = Path.home() / ".cache/specfill/models"


def _save(path: Path, result: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    os.replace(tmp, path)


def _setup(args) -> tuple[dict, object, object, object]:
    import torch

    torch.set_num_threads(args.threads)
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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--speculator", default="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = default_settings() if args.settings is None else dict(map(parse_setting, args.settings))
    if args.only_full:
        settings = {}
    result, model, tokenizer, speculator = _setup(args)
    run = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": describe_machine()}
    result["runs"].append(run)
    done = {(r["task"], r["index"], r["setting"]) for r in result["records"]}

    def keep(record: dict) -> None:
        result["records"].append(record)
        done.add((record["task"], record["index"], record["setting"]))
        run["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
        _save(args.out, result)
        print(f"{record['task']} #{record['index']} {record['setting']}: score {record['score']:.2f} "
              f"TTFT {record['ttft_s']:.1f} s kept {record['kept_tokens']} answer kept {record['answer_kept']} "
              f"| {record['prediction'][:70]!r}", flush=True)

    for task in args.tasks.split(","):
        for index in map(int, args.samples.split(",")):
            sample = build_sample(tokenizer, task, args.length, index, args.seed, True)
            budget = resolve_budget(sample, args.answer_tokens)
            if (args.full or args.only_full) and (task, index, "full") not in done:
                keep(run_api(model, tokenizer, sample, "full", PrefillMethod("full"), budget))
            spec = {k: v for k, v in settings.items() if isinstance(v, SpecPrefillConfig) and (task, index, k) not in done}
            if spec:
                run_specprefill(model, speculator, tokenizer, sample, spec, budget, keep)
            for label, config in settings.items():
                if isinstance(config, H2OConfig) and (task, index, label) not in done:
                    keep(run_api(model, tokenizer, sample, label, PrefillMethod("h2o", h2o=config), budget))


if __name__ == "__main__":
    main()
