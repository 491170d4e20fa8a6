"""A speculator cut to its first K layers that still looks ahead: its look-ahead tokens come from
those K layers' hidden state through the final norm and LM head (early exit, as a "self:K"
speculator's do). probe.py found that scoring from the first layers without any look-ahead loses a
variable-tracking hop at 16K that the whole speculator's look-ahead finds; this runs the cut
speculator for real (its H2O prompt pass, window 64, 8 look-ahead tokens) on the protocol's samples
(ids from the saved passes) and scores `auto`'s composition on it. Writes results as it goes.

    .venv/bin/python research/speculator_depth/early_exit.py RECORDS.json PASSES_DIR --depth 16 --out FILE
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
    from specfill.core.config import AUTO_COMPOSITION
    from specfill.core.methods.specprefill import run_speculator
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_passes import PASS_LOOKAHEAD, PASS_QUERY_WINDOW, SavedPass, prefill_name
    from specfill.evaluation.ruler_protocol import write_atomic

    sys.path.insert(0, str(Path(__file__).parent))
    from probe import HELD, reduced_heads

    p = argparse.ArgumentParser()
    p.add_argument("records", type=Path)
    p.add_argument("passes", type=Path)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    spec, tokenizer = api.load(str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), backend="cuda", dtype="float32")
    ops, model = spec.ops, spec.model
    view = ops.first_layers(model, args.depth)
    h2o = AUTO_COMPOSITION.speculator_prefill
    data = json.loads(args.records.read_text())
    samples = {}
    for r in data["records"]:
        samples.setdefault((r["task"], r["tokens"], r["index"]), r["spans"])
    order = sorted(samples, key=lambda k: (TASK_ORDER.index(k[0]), k[2]))
    result = {"machine": describe_machine(), "depth": args.depth, "of": model.args.num_hidden_layers, "rows": []}
    for task, tokens, index in order:
        saved = SavedPass.load(args.passes / f"{task}_{tokens}_0_{index}_chat_{prefill_name(h2o)}.npz")
        began = time.perf_counter()
        with ops.device_scope():
            run = run_speculator(
                ops,
                view,
                saved.ids,
                lookahead=PASS_LOOKAHEAD,
                stop_ids=frozenset(tokenizer.eos_token_ids),
                step_size=spec.prefill_step_size,
                query_window=PASS_QUERY_WINDOW,
                h2o=h2o,
            )
            cut = dataclasses.replace(
                saved,
                queries=ops.to_numpy(run.queries).astype(np.float32),
                keys=ops.to_numpy(run.keys).astype(np.float32),
                windows=saved.windows[: args.depth],
                n_window=run.n_window,
                seconds=time.perf_counter() - began,
            )
        per_layer = reduced_heads(cut, AUTO_COMPOSITION.pool_kernel, AUTO_COMPOSITION.head_reduction)
        from specfill.evaluation.ruler_passes import PassScores

        scores = PassScores(cut)
        scores._per_layer = {(AUTO_COMPOSITION.pool_kernel, AUTO_COMPOSITION.head_reduction): per_layer}
        kept = scores.select(AUTO_COMPOSITION).kept
        row = np.zeros(len(saved.ids))
        row[kept] = 1.0
        shares = [float(row[a:b].mean()) if b > a else 0.0 for a, b in samples[task, tokens, index].get("needle", [])]
        result["rows"].append(
            {
                "task": task,
                "index": index,
                "pass_s": cut.seconds,
                "lookahead": run.lookahead,
                "kept_share": len(kept) / len(saved.ids),
                "answer_kept": shares,
                "all_kept": all(s >= HELD for s in shares),
            }
        )
        print(f"{task} {index}: pass {cut.seconds:.0f} s, spans {[round(s, 2) for s in shares]}", flush=True)
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    rows = result["rows"]
    print(f"depth {args.depth}: {sum(r['all_kept'] for r in rows)}/{len(rows)} samples keep every span")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
