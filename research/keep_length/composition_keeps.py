"""`auto`'s composition (core/config.AUTO_COMPOSITION) at several flat keep ratios (its length rule off:
keep_growth None) from ONE speculator pass per sample: the nested H2O pass, its look-ahead and the
scoring do not depend on the keep ratio, so the pass runs once (speculate_and_select, its importance
captured) and each ratio's selection is made from the same importance (select_new_tokens, as the product
does). A sample keeps its answer when every answer span is at least half kept (the protocol's rule).
RULER samples as `specfill eval` builds them (seed 0, chat template); the 0.5B speculator alone, bf16 on
the CPU, 2 threads. Writes results as it goes.

    .venv/bin/python research/keep_length/composition_keeps.py --length 32000 --trials 4 \
        --keeps 0.1,0.09,0.08,0.07,0.06,0.05 --out research/keep_length/results/composition_keeps_32k.json
    ... --deep-from 0.33   # the nested pass split at a third of the speculator's layers instead
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

TASKS = ("vt", "niah_multikey_2", "qa_1", "qa_2", "niah_multivalue")
MODELS = Path.home() / ".cache" / "specfill" / "models"


def main(argv=None) -> int:
    import specfill.core.methods.specprefill as sp
    from specfill import api
    from specfill.core.config import AUTO_COMPOSITION
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_protocol import write_atomic
    from specfill.evaluation.ruler_report import DROPPED_BELOW
    from specfill.evaluation.ruler_run import span_shares
    from specfill.evaluation.ruler_tasks import build_sample

    p = argparse.ArgumentParser()
    p.add_argument("--length", type=int, default=32000)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--keeps", default="0.1,0.09,0.08,0.07,0.06,0.05")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--deep-from", type=float, default=None, help="the nested pass's split (default: the product's)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    keeps = [float(k) for k in args.keeps.split(",")]
    spec, tokenizer = api.load(
        str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), backend="cuda", dtype=args.dtype, device="cpu"
    )[:2]
    base = dataclasses.replace(AUTO_COMPOSITION, keep_growth=None)  # each ratio as given, at every length
    if args.deep_from is not None:
        base = dataclasses.replace(base, deep_from=args.deep_from)
    captured: dict[str, np.ndarray] = {}
    select = sp.select_new_tokens

    def capture(importance, reused, config):
        captured["importance"] = np.array(importance)
        return select(importance, reused, config)

    sp.select_new_tokens = capture
    result = json.loads(args.out.read_text()) if args.out.exists() else {"rows": []}
    result.update(machine=describe_machine(), config=repr(base), keeps=keeps, dtype=args.dtype)
    done = {(r["task"], r["index"]) for r in result["rows"]}
    for task in args.tasks.split(","):
        for index in range(args.trials):
            if (task, index) in done:
                continue
            sample = build_sample(tokenizer, task, args.length, index, 0, True)
            ids = np.asarray(api.encode_prompt(tokenizer, sample.prompt), np.int64)
            began = time.perf_counter()
            with spec.ops.device_scope():
                _, selection, seconds = sp.speculate_and_select(
                    spec.ops,
                    spec.model,
                    ids,
                    base,
                    stop_ids=frozenset(tokenizer.eos_token_ids),
                    speculator_step_size=spec.prefill_step_size,
                )
            pass_s = time.perf_counter() - began
            spans = sample.spans.get("needle", [])
            per_keep = {}
            for keep in keeps:
                kept = sp.select_new_tokens(captured["importance"], 0, dataclasses.replace(base, keep_ratio=keep)).kept
                if keep == base.keep_ratio:  # the product's own selection, reproduced
                    assert np.array_equal(np.sort(kept), np.sort(selection.kept)), "selection not reproduced"
                row = np.zeros(len(ids))
                row[kept] = 1.0
                shares = span_shares(row, spans)
                per_keep[str(keep)] = {
                    "kept_tokens": int(len(kept)),
                    "kept_share": round(len(kept) / len(ids), 4),
                    "answer_kept": shares,
                    "all_kept": all(s >= DROPPED_BELOW for s in shares),
                }
            result["rows"].append(
                {"task": task, "index": index, "tokens": len(ids), "pass_s": round(pass_s, 1), "parts_s": seconds}
                | {"keeps": per_keep}
            )
            write_atomic(args.out, json.dumps(result, indent=1) + "\n")
            summary = " ".join(f"{k}:{'Y' if v['all_kept'] else 'n'}/{v['kept_tokens']}" for k, v in per_keep.items())
            print(f"{task} #{index} ({len(ids)} tokens, pass {pass_s:.0f} s): {summary}", flush=True)
    rows = result["rows"]
    for keep in keeps:
        held = sum(r["keeps"][str(keep)]["all_kept"] for r in rows)
        share = np.mean([r["keeps"][str(keep)]["kept_share"] for r in rows])
        print(f"keep {keep}: {held}/{len(rows)} samples with every span kept, kept share {share:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
