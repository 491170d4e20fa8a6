"""Tables and plots of scripts/ruler_fix.py's records (issue 24, items 2-3):

    .venv/bin/python scripts/ruler_fix_report.py results/eval/ruler/fix_runs/fix.json \\
        --out results/eval/ruler --name qwen_pair_4k_fix

writes <name>.json (records with causes, the summary rows, every run's machine line and loads),
<name>.md, <name>_tradeoff.png and <name>_positions_<task>.png (every setting on one sample).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specfill.evaluation.machine import machine_line
from specfill.evaluation.ruler_fix_report import markdown, plot_fix, plot_positions, summarize


def _title(result: dict) -> str:
    plan, machine = result["plan"], result["runs"][-1]["machine"]
    return (f"{plan['model']} (speculator {plan['speculator']}), {plan['dtype']}, torch on {plan['device']}, "
            f"{machine.get('torch_threads', '?')} thread(s) ({machine['cpu'][:20]}), ~{plan['length']}-token prompts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--map-sample", type=int, default=0, help="sample index drawn in the positions maps")
    args = parser.parse_args()
    result = json.loads(args.records.read_text())
    records = result["records"]
    rows = summarize(records)
    title = _title(result)
    runs = [f"- run {r['started']}: {machine_line(r['machine'])}; load at end {r.get('load_average_1min_at_end', '-')}"
            for r in result["runs"]]
    header = [f"# RULER: which setting keeps the answer ({title})", "",
              "Measured on a shared, loaded 2-core CPU (other jobs running): not quiet-machine figures. "
              "SpecPrefill TTFT = the speculator pass (timed once per sample) + the setting's selection, sparse "
              "prefill and first token; full prefill and H2O through the API. Runs (machine, load average):", "", *runs]
    args.out.mkdir(parents=True, exist_ok=True)
    stored = [{k: v for k, v in r.items() if k not in ("map", "spans")} for r in records]
    (args.out / f"{args.name}.json").write_text(json.dumps({"plan": result["plan"], "runs": result["runs"],
                                                            "rows": rows, "records": stored}, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text("\n".join(markdown(rows, records, header)) + "\n")
    plot_fix(rows, args.out / f"{args.name}_tradeoff.png", title)
    for task in dict.fromkeys(r["task"] for r in records):
        plot_positions(records, task, args.map_sample, args.out / f"{args.name}_positions_{task}.png",
                       f"{task} #{args.map_sample}: kept (SpecPrefill) / in last memory sets (H2O); {title}")


if __name__ == "__main__":
    main()
