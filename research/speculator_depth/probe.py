"""How deep must the speculator read? Scoring from its first K layers only (issue 47: the
composition is capped by the speculator's projections and MLP over every prompt token).

A speculator that stops after layer K computes exactly the first K layers' keys and its window
queries (layer i depends on layers <= i only, dense or H2O), so the saved passes of the selection
protocol (evaluation/ruler_passes.py: every layer's window queries and prompt keys) give its
selection without running anything: slice the pass to its first K layers and score it with the
candidate's settings ("all" = every one of those K layers). Its look-ahead is the one thing a
truncated speculator cannot reproduce (the look-ahead tokens come from the whole model); rows
with `lookahead=0` are exact for it, rows with the look-ahead are the optimistic bound.

A study: it reads saved passes and records, runs no model.

    python research/speculator_depth/probe.py RECORDS.json PASSES_DIR --out research/speculator_depth/results/NAME
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

HELD = 0.5  # a span is kept when at least this share of it is (the protocol's rule)


def main(argv=None) -> int:
    from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
    from specfill.evaluation.ruler_passes import PassScores, SavedPass, prefill_name
    from specfill.evaluation.ruler_protocol import expand_map

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("passes", type=Path)
    parser.add_argument("--depths", default="24,20,16,14,12,10,8,6,4")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--base",
        choices=("auto", "default"),
        default="auto",
        help="auto: AUTO_COMPOSITION on H2O passes; default: SpecPrefill's default (and window 32), dense passes",
    )
    args = parser.parse_args(argv)

    data = json.loads(args.records.read_text())
    samples = {}
    for r in data["records"]:
        samples.setdefault((r["task"], r["tokens"], r["index"]), r["spans"])
    base = AUTO_COMPOSITION if args.base == "auto" else SpecPrefillConfig()
    reference = "c+h2o 0.1 w32 nb1" if args.base == "auto" else "dense 0.3"  # the protocol's record of `base`
    recorded = {(r["task"], r["tokens"], r["index"]): r["map"] for r in data["records"] if r["setting"] == reference}
    if args.base == "auto":
        settings = {"composition (auto)": base, "composition, no look-ahead": dataclasses.replace(base, lookahead=0)}
    else:
        window = dataclasses.replace(base, query_window=32)
        settings = {
            "default": base,
            "default, no look-ahead": dataclasses.replace(base, lookahead=0),
            "window 32": window,
            "window 32, no look-ahead": dataclasses.replace(window, lookahead=0),
        }
    depths = [int(d) for d in args.depths.split(",")]
    rows = []
    prefill = prefill_name(base.speculator_prefill)
    suffix = "" if base.speculator_prefill is None else f"_{prefill}"
    for (task, tokens, index), spans in sorted(samples.items()):
        path = args.passes / f"{task}_{tokens}_0_{index}_chat{suffix}.npz"
        if not path.exists():
            print(f"no pass: {path.name}", file=sys.stderr)
            continue
        saved = SavedPass.load(path)
        n_layers = saved.queries.shape[0]
        started = time.perf_counter()
        per_layer = {(c.pool_kernel, c.head_reduction) for c in settings.values()}
        per_layer = {key: reduced_heads(saved, *key) for key in per_layer}  # [n_q, n_l, P]: layer by layer
        for depth in depths:
            if depth > n_layers:
                continue
            cut = dataclasses.replace(
                saved, queries=saved.queries[:depth], keys=saved.keys[:depth], windows=saved.windows[:depth]
            )
            scores = PassScores(cut)  # each layer's scores are its own: the first `depth` layers' columns
            scores._per_layer = {key: value[:, :depth] for key, value in per_layer.items()}
            for name, config in settings.items():
                kept = scores.select(config).kept
                row = np.zeros(len(saved.ids))
                row[kept] = 1.0
                if depth == n_layers and config == base and (task, tokens, index) in recorded:
                    same = np.array_equal(row, expand_map(recorded[task, tokens, index]))
                    print(
                        f"  depth {depth}: the recorded selection {'reproduced' if same else 'DIFFERS'}",
                        file=sys.stderr,
                    )
                shares = [float(row[a:b].mean()) if b > a else 0.0 for a, b in spans.get("needle", [])]
                rows.append(
                    {
                        "task": task,
                        "tokens": tokens,
                        "index": index,
                        "depth": depth,
                        "of": n_layers,
                        "setting": name,
                        "kept_share": len(kept) / len(saved.ids),
                        "answer_kept": shares,
                        "all_kept": all(s >= HELD for s in shares),
                    }
                )
        print(f"{task} {index}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"records": str(args.records), "passes": str(args.passes), "rows": rows}, indent=1))
    tmp.replace(args.out.with_suffix(".json"))
    print(report(rows))
    return 0


def reduced_heads(saved, kernel: int, heads: str) -> np.ndarray:
    """PassScores._reduced_heads (the reference's float64 softmax over the prompt keys, masked for
    the observation window's queries, pooled, heads reduced) with torch's float64 matmul in place of
    NumPy's einsum (minutes per layer at 32K keys): [n_q, n_l, P]."""
    import torch

    from specfill.core.reference.specprefill import reduce_axis, scoring_mask, smooth_scores
    from specfill.core.stages import query_start

    if any(w is not None for w in saved.windows):
        raise SystemExit("a speculator with sliding windows: use PassScores")
    n_l, n_q, n_heads, _ = saved.queries.shape
    n_keys = saved.keys.shape[2]
    visible = torch.from_numpy(scoring_mask(n_q, n_keys, None, query_start(n_keys, saved.n_window)))
    layers = []
    for i in range(n_l):
        q = torch.from_numpy(saved.queries[i]).double().transpose(0, 1)  # [Hq, n_q, D]
        k = torch.from_numpy(saved.keys[i]).double().repeat_interleave(n_heads // saved.keys.shape[1], 0)
        logits = (q @ k.transpose(1, 2)) * saved.scale  # [Hq, n_q, P]
        logits = logits.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(logits, dim=-1).transpose(0, 1)[:, None].numpy()  # [n_q, 1, Hq, P]
        layers.append(reduce_axis(smooth_scores(probs, kernel), heads, axis=2))
    return np.concatenate(layers, axis=1)


def report(rows: list[dict]) -> str:
    tasks = sorted({r["task"] for r in rows})
    lines = [
        "| setting | depth | samples with every span | span recall | kept share | " + " | ".join(tasks) + " |",
        "|---" * (5 + len(tasks)) + "|",
    ]
    keys = sorted({(r["setting"], r["depth"]) for r in rows}, key=lambda k: (k[0], -k[1]))
    for setting, depth in keys:
        sel = [r for r in rows if r["setting"] == setting and r["depth"] == depth]
        recall = np.mean([s >= HELD for r in sel for s in r["answer_kept"]])
        per_task = [
            f"{sum(r['all_kept'] for r in sel if r['task'] == t)}/{sum(r['task'] == t for r in sel)}" for t in tasks
        ]
        lines.append(
            f"| {setting} | {depth}/{sel[0]['of']} | {sum(r['all_kept'] for r in sel)}/{len(sel)} | {recall:.3f} | "
            f"{np.mean([r['kept_share'] for r in sel]):.3f} | " + " | ".join(per_task) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
