"""The product's nested speculator (SpecPrefillConfig.deep_keep, core/methods/speculator_depth.py)
on the selection protocol's samples: `auto`'s composition scored by the 0.5B's first K layers with
`deep_keep`, run through speculate_and_select (the speculator alone, torch float32, ids from the
saved passes), each sample's answer spans kept (the protocol's rule) and its pass time. Writes
results as it goes.

    .venv/bin/python research/speculator_depth/nested_selection.py RECORDS PASSES --depth 12 --deep-keep 0.3 --out FILE
    ... --deep-from 12 --deep-keep 0.3   # every layer scores, those from 12 on over the subset
    ... --base default                   # SpecPrefill's defaults (dense passes) instead of auto's composition
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

TASK_ORDER = ("vt", "niah_multikey_2", "qa_1", "qa_2", "niah_multivalue")
MODELS = Path.home() / ".cache" / "specfill" / "models"


def main(argv=None) -> int:
    from specfill import api
    from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
    from specfill.core.methods.specprefill import speculate_and_select
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_passes import SavedPass, pass_path
    from specfill.evaluation.ruler_protocol import write_atomic

    sys.path.insert(0, str(Path(__file__).parent))
    from probe import HELD

    p = argparse.ArgumentParser()
    p.add_argument("records", type=Path)
    p.add_argument("passes", type=Path)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--deep-keep", type=float, default=0.3)
    p.add_argument(
        "--deep-from", type=float, default=None, help="score with every layer, the deeper ones over the subset"
    )
    p.add_argument(
        "--base", choices=("auto", "default"), default="auto", help="auto's composition or SpecPrefill's defaults"
    )
    p.add_argument("--tasks", default=",".join(TASK_ORDER))
    p.add_argument("--indices", default=None, help="only these sample indices (e.g. 1,3)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    spec, tokenizer = api.load(str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), backend="cuda", dtype="float32")
    base = AUTO_COMPOSITION if args.base == "auto" else SpecPrefillConfig()
    if args.deep_from is None:  # the first `depth` layers read every token and score
        config = dataclasses.replace(base, layers=f"first-{args.depth}", deep_keep=args.deep_keep)
    else:  # every layer scores; those from deep_from on read the subset
        config = dataclasses.replace(base, layers="all", deep_keep=args.deep_keep, deep_from=args.deep_from)
    data = json.loads(args.records.read_text())
    samples = {}
    for r in data["records"]:
        samples.setdefault((r["task"], r["tokens"], r["index"]), r["spans"])
    tasks = args.tasks.split(",")
    indices = None if args.indices is None else {int(i) for i in args.indices.split(",")}
    wanted = [k for k in samples if k[0] in tasks and (indices is None or k[2] in indices)]
    order = sorted(wanted, key=lambda k: (TASK_ORDER.index(k[0]), k[2]))
    result = {"machine": describe_machine(), "config": repr(config), "rows": []}
    for task, tokens, index in order:
        name = f"{task}_{tokens}_0_{index}_chat"
        own = pass_path(args.passes, name, config)
        # without this prefill's pass, the same prompt's ids from a pass of another speculator prefill
        path = own if own.exists() else next(iter(sorted(args.passes.glob(f"{name}*.npz"))), own)
        if not path.exists():
            print(f"no pass: {path.name}", file=sys.stderr)
            continue
        saved = SavedPass.load(path)
        whole = path == own  # saved_pass_s: this prefill's whole pass
        began = time.perf_counter()
        with spec.ops.device_scope():
            run, selection, seconds = speculate_and_select(
                spec.ops,
                spec.model,
                saved.ids,
                config,
                stop_ids=frozenset(tokenizer.eos_token_ids),
                speculator_step_size=spec.prefill_step_size,
            )
        row = np.zeros(len(saved.ids))
        row[selection.kept] = 1.0
        shares = [float(row[a:b].mean()) if b > a else 0.0 for a, b in samples[task, tokens, index].get("needle", [])]
        result["rows"].append(
            {
                "task": task,
                "tokens": tokens,
                "index": index,
                "seconds": time.perf_counter() - began,
                "parts_s": seconds,
                "saved_pass_s": saved.seconds if whole else None,
                "ids_from": path.name,
                "lookahead": run.lookahead,
                "kept_share": len(selection.kept) / len(saved.ids),
                "answer_kept": shares,
                "all_kept": all(s >= HELD for s in shares),
            }
        )
        print(
            f"{task} {index}: pass {seconds['speculator']:.0f} s ({path.name}: {saved.seconds:.0f} s), "
            f"spans {[round(s, 2) for s in shares]}",
            flush=True,
        )
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    rows = result["rows"]
    held = sum(r["all_kept"] for r in rows)
    print(f"{config.layers}, deep_keep {args.deep_keep}, deep_from {args.deep_from}: {held}/{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
