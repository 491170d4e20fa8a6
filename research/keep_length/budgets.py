"""How SpecPrefill's keep budget could follow the prompt's length (issue 47 item 2): on the selection
protocol's records (`specfill eval --candidates ... --selection-only`, one file per length), per
length and keep setting, the samples that keep every answer span (each at least 50% kept, the
protocol's rule), the mean span recall and the tokens kept; the smallest keep ratio that keeps as
many samples as keep 0.3 (the default) less at most one; a plot of both against the tokens kept.
A study: it reads records, runs no model.

    python research/keep_length/budgets.py RECORDS.json [RECORDS.json ...] --out research/keep_length/results/budgets

Each file may hold several lengths; a setting is named as the protocol names it ("max 0.2": keep
ratio 0.2, max over layers; "tokens 1600": a 1,600-token budget).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

DEFAULT = 0.3  # SpecPrefillConfig's keep ratio (core/config.DEFAULT_KEEP_RATIO)
HELD = 0.5  # a span is kept when at least this share of it is (the protocol's rule)


def plain(config: dict) -> bool:
    """The default SpecPrefillConfig but for its keep ratio or token budget (a record written
    before a field existed has that field's default)."""
    from specfill.core import SpecPrefillConfig

    default = SpecPrefillConfig()
    return all(
        json.loads(json.dumps(config.get(name, getattr(default, name))))
        == json.loads(json.dumps(getattr(default, name)))
        for name in ("keep_mass", "lookahead", "pool_kernel", "select_chunk", "layers", "head_reduction")
        + ("layer_reduction", "lookahead_reduction", "neighbours", "token_floor", "keep_first", "keep_last")
        + ("select_units", "query_window", "speculator_prefill", "force_keep_last")
    )


def load(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """The SpecPrefill records of the files with the default config but for the keep rule (one per
    (length, task, sample, setting): the last wins) and a line per file naming its run."""
    records: dict[tuple, dict] = {}
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        plan, machine = data["plan"], (data.get("runs") or [{}])[-1].get("machine", {})
        runs.append(
            f"{path.name}: {plan['speculator']} ({plan['dtype']}, {plan['backend']}), "
            f"{machine.get('cpu', '?')} [{machine.get('cpu_features', '?')}], "
            f"{machine.get('torch_threads', '?')} thread(s)"
        )
        for r in data["records"]:
            if r.get("kind") == "specprefill" and r.get("answer_kept") and plain(r["config"]):
                records[(r["tokens"], r["task"], r["index"], r["setting"])] = r
    return list(records.values()), runs


def table(records: list[dict]) -> list[dict]:
    """One row per (length, setting): samples, every-span-kept count, mean recall, median kept share."""
    groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[r["tokens"], r["setting"]].append(r)
    rows = []
    for (length, setting), mine in sorted(groups.items()):
        rows.append(
            {
                "length": length,
                "setting": setting,
                "ratio": mine[0]["config"].get("keep_ratio"),
                "budget": mine[0]["config"].get("keep_tokens"),
                "samples": len(mine),
                "kept_all": sum(min(r["answer_kept"]) >= HELD for r in mine),
                "recall": float(np.mean([np.mean(r["answer_kept"]) for r in mine])),
                "kept_tokens": float(np.median([r["kept_tokens"] for r in mine])),
                "kept_share": float(np.median([r["kept_tokens"] / r["prompt_tokens"] for r in mine])),
                "tasks": sorted({r["task"] for r in mine}),
            }
        )
    return rows


def smallest_ratio(rows: list[dict]) -> dict[int, dict | None]:
    """Per length: the smallest keep ratio whose every-span-kept count is at least the default's
    less one (over the same samples), or None where the default was not run."""
    out: dict[int, dict | None] = {}
    for length in sorted({r["length"] for r in rows}):
        ratios = sorted((r for r in rows if r["length"] == length and r["ratio"] is not None), key=lambda r: r["ratio"])
        default = next((r for r in ratios if abs(r["ratio"] - DEFAULT) < 1e-9), None)
        if default is None:
            out[length] = None
            continue
        same = [r for r in ratios if r["samples"] == default["samples"]]
        out[length] = next(r for r in same if r["kept_all"] >= default["kept_all"] - 1)
    return out


def write(rows: list[dict], runs: list[str], out: Path) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    best = smallest_ratio(rows)
    lines = [
        "# SpecPrefill keep budgets by prompt length (selection proxy)",
        "",
        *[f"- {run}" for run in runs],
        "",
        f"A sample keeps its answer when every answer span is at least {HELD:.0%} kept. The smallest ratio: "
        f"the smallest keep ratio keeping as many samples as keep {DEFAULT} (the default) less at most one.",
        "",
        "| length | smallest ratio | its kept tokens (median) | samples kept: it / keep 0.3 |",
        "|---|---|---|---|",
    ]
    for length, row in best.items():
        default = next((r for r in rows if r["length"] == length and r["ratio"] == DEFAULT), None)
        if row is None or default is None:
            lines.append(f"| {length} | - | - | - |")
        else:
            lines.append(
                f"| {length} | {row['ratio']} | {row['kept_tokens']:.0f} | "
                f"{row['kept_all']}/{row['samples']} / {default['kept_all']}/{default['samples']} |"
            )
    lines += [
        "",
        "| length | setting | samples | every span kept | span recall | kept tokens (median) | kept share | tasks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['length']} | {r['setting']} | {r['samples']} | {r['kept_all']}/{r['samples']} | "
            f"{r['recall']:.3f} | {r['kept_tokens']:.0f} | {r['kept_share']:.3f} | {', '.join(r['tasks'])} |"
        )
    md, data = out.with_suffix(".md"), out.with_suffix(".json")
    md.write_text("\n".join(lines) + "\n")
    data.write_text(json.dumps({"runs": runs, "rows": rows, "smallest_ratio": best}, indent=1))
    written = [md, data]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for length in sorted({r["length"] for r in rows}):
        mine = sorted((r for r in rows if r["length"] == length and r["ratio"] is not None), key=lambda r: r["ratio"])
        x = [r["kept_tokens"] for r in mine]
        axes[0].plot(x, [r["kept_all"] / r["samples"] for r in mine], "o-", label=f"~{length // 1000}K")
        axes[1].plot(x, [r["recall"] for r in mine], "o-", label=f"~{length // 1000}K")
        for r in mine:
            axes[0].annotate(f"{r['ratio']:g}", (r["kept_tokens"], r["kept_all"] / r["samples"]), fontsize=7)
    axes[0].set_ylabel("samples with every answer span kept")
    axes[1].set_ylabel("mean answer-span recall")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("tokens kept (median; points: keep ratio)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SpecPrefill keep budget vs prompt length (RULER selection proxy)\n" + "\n".join(runs), fontsize=7)
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=120)
    return [*written, png]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="path without suffix (.md, .json, .png written)")
    args = parser.parse_args()
    records, runs = load(args.records)
    for path in write(table(records), runs, args.out):
        print(path)


if __name__ == "__main__":
    main()
