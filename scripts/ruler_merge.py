"""Merge several `specfill eval` RULER runs (one task per run keeps each under the 10-minute
budget of a shared CPU) into one JSON + Markdown + trade-off plot.

    .venv/bin/python scripts/ruler_merge.py results/eval/ruler/qwen_pair_4k_*.json \\
        --out results/eval/ruler --name qwen_pair_4k

Rows and per-sample records are concatenated, scores and speed-ups vs full and loss causes
recomputed over the runs (full prefill may have run in another run, under another load); each run's machine
line and load
averages (start and end) are kept per run, and each run's own positions PNG stays beside it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specfill.evaluation.eval_report import plot_title
from specfill.evaluation.machine import machine_line
from specfill.evaluation.ruler_report import loss_causes, plot_ruler_tradeoff, ruler_markdown
from specfill.evaluation.ruler_run import add_ruler_deltas, summary_row


def merge(paths: list[Path]) -> dict:
    """One result: the first run's plan (tasks and lengths joined over the runs) and machine,
    every run's rows and samples, and per run its name, machine line, loads and completeness."""
    runs = [json.loads(p.read_text()) for p in paths]
    merged = {**runs[0], "ruler": [], "ruler_samples": [], "runs": []}
    for path, run in zip(paths, runs):
        merged["ruler_samples"] += run["ruler_samples"]
        merged["runs"].append(
            {
                "file": path.name,
                "complete": run.get("complete"),
                "machine": machine_line(run["machine"]),
                "load_average_1min_at_end": run["machine"].get("load_average_1min_at_end"),
                "tasks": run["plan"]["tasks"],
            }
        )
    merged["plan"] = {
        **runs[0]["plan"],
        "tasks": [t for run in runs for t in run["plan"]["tasks"]],
        "ruler_lengths": sorted({n for run in runs for n in run["plan"]["ruler_lengths"]}),
    }
    cells: dict[tuple, list[dict]] = {}
    for record in merged["ruler_samples"]:  # a cell's samples may come from several runs
        cells.setdefault((record["task"], record["tokens"], record["method"]), []).append(record)
    merged["ruler"] = [{**summary_row(records), "tokens": key[1]} for key, records in cells.items()]
    add_ruler_deltas(merged)  # across runs: full's TTFT may come from another run (another load)
    merged["ruler_loss_causes"] = loss_causes(merged)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    merged = merge(args.runs)
    title = plot_title(merged)
    lines = [f"# RULER tasks: {title}", "", "Runs (machine, 1-minute load average at the start and at the end):", ""]
    lines += [
        f"- {r['file']}: {', '.join(r['tasks'])}{'' if r['complete'] else ' (PARTIAL: stopped at the time limit)'}; "
        f"{r['machine']}; load at end {r['load_average_1min_at_end']}"
        for r in merged["runs"]
    ]
    lines += ruler_markdown(merged)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(merged, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    plot_ruler_tradeoff(
        merged["ruler"],
        merged["plan"].get("defaults", []),
        args.out / f"{args.name}_tradeoff.png",
        f"RULER score vs speed-up: {title}",
    )
    print(args.out / f"{args.name}.md")


if __name__ == "__main__":
    main()
