"""How SpecPrefill's keep budget could follow the prompt's length (issue 47 item 2): on the selection
protocol's records (`specfill eval --candidates ... --selection-only`, one file per length), per
length and keep setting, the samples that keep every answer span (each at least 50% kept, the
protocol's rule), the mean span recall and the tokens kept; the smallest keep ratio that keeps as
many samples as keep 0.3 (the default) less at most one; budget rules (tokens kept growing as a
power of the length, keep 0.3 at 4K) checked at every length; the same counts per task; a plot of
both against the tokens kept. Records of a scoring variant named in VARIANTS (the prompt's last
queries, `query_window`) are read beside the default's, as their own rows and curves; the rules and
the smallest ratio are the default scoring's.
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
GROWTHS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)  # the budget rules tried (keep_growth): tokens ~ length ** growth
# read beside the default: the scoring variants, and the growth rules' own runs (keep_growth=g)
VARIANTS = ("query_window=32", "query_window=64", "neighbours=1", "neighbours=1,query_window=32") + tuple(
    f"keep_growth={g}" for g in GROWTHS if g != 1.0
) + ("keep_growth=0.7,query_window=32", "keep_growth=0.5,query_window=32")  # growth rules with the window


FIELDS = ("keep_mass", "keep_growth", "lookahead", "pool_kernel", "select_chunk", "layers", "head_reduction") + (
    "layer_reduction", "lookahead_reduction", "neighbours", "token_floor", "keep_first", "keep_last"
) + ("select_units", "query_window", "speculator_prefill", "force_keep_last")


def variant(config: dict) -> str:
    """The fields (but the keep rule) where a record's SpecPrefillConfig differs from the default,
    "field=value,..." ("default" where none does; a record written before a field existed has that
    field's default)."""
    from specfill.core import SpecPrefillConfig

    default = SpecPrefillConfig()
    differs = []
    for name in FIELDS:
        value = json.loads(json.dumps(config.get(name, getattr(default, name))))
        if value != json.loads(json.dumps(getattr(default, name))):
            differs.append(f"{name}={value}")
    return ",".join(differs) or "default"


def load(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """The SpecPrefill records of the files (one per (length, task, sample, setting): the last wins),
    each with its "variant", and a line per file naming its run."""
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
            if r.get("kind") == "specprefill" and r.get("answer_kept"):
                r = {**r, "variant": variant(r["config"])}
                if r["variant"] == "default" or r["variant"] in VARIANTS:
                    records[(r["tokens"], r["task"], r["index"], r["setting"])] = r
    return list(records.values()), runs


def table(records: list[dict]) -> list[dict]:
    """One row per (length, variant, setting): samples, every-span-kept count, mean recall, median kept share."""
    groups: dict[tuple[int, str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[r["tokens"], r["variant"], r["setting"]].append(r)
    rows = []
    for (length, kind, setting), mine in sorted(groups.items()):
        rows.append(
            {
                "length": length,
                "variant": kind,
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
    less one (over the same samples), or None where the default was not run (the default scoring)."""
    rows = [r for r in rows if r["variant"] == "default"]
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


def rule_ratio(growth: float, length: int) -> float:
    """The keep ratio of SpecPrefillConfig(keep_ratio=0.3, keep_growth=growth) at `length` tokens
    (SpecPrefillConfig.share: the default ratio up to 4096 tokens, then tokens kept ~ length ** growth)."""
    from specfill.core import SpecPrefillConfig

    return SpecPrefillConfig(keep_ratio=DEFAULT, keep_growth=growth).share(length)


def rules(rows: list[dict]) -> list[dict]:
    """Each growth rule against the records: at each length the rule's own records where they were
    run (a `keep_growth=g` candidate, keep 0.3; "measured_ratio" None), else the smallest measured
    ratio at least the rule's (the rule rounded up to what was measured); its every-span-kept count
    and the default's; the rule holds at a length when it keeps as many samples as the default less
    at most one (the default scoring, the same samples)."""
    grown = {(r["length"], r["variant"]): r for r in rows if r["variant"].startswith("keep_growth=")}
    rows = [r for r in rows if r["variant"] == "default"]
    out = []
    for growth in GROWTHS:
        for length in sorted({r["length"] for r in rows}):
            ratios = sorted((r for r in rows if r["length"] == length and r["ratio"] is not None), key=lambda r: r["ratio"])
            default = next((r for r in ratios if abs(r["ratio"] - DEFAULT) < 1e-9), None)
            want = rule_ratio(growth, length)
            own = grown.get((length, f"keep_growth={growth}"))
            if own is not None and own["ratio"] == DEFAULT:
                got, measured = own, None
            else:
                got = next((r for r in ratios if r["ratio"] >= want - 1e-9 and default and r["samples"] == default["samples"]), None)
                measured = None if got is None else got["ratio"]
            if default is None or got is None or got["samples"] != default["samples"]:
                continue
            out.append({"growth": growth, "length": length, "rule_ratio": want, "measured_ratio": measured,
                        "kept_all": got["kept_all"], "default_kept_all": default["kept_all"], "samples": got["samples"],
                        "holds": got["kept_all"] >= default["kept_all"] - 1})
    return out


def per_task(records: list[dict]) -> dict[tuple[int, str], dict[str, str]]:
    """(length, setting) -> task -> "kept/samples" (every answer span at least HELD kept)."""
    cells: dict[tuple[int, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        cells[r["tokens"], r["setting"]][r["task"]].append(min(r["answer_kept"]) >= HELD)
    return {key: {task: f"{sum(v)}/{len(v)}" for task, v in sorted(tasks.items())} for key, tasks in sorted(cells.items())}


def _atomic_write(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    part.replace(path)


def write(rows: list[dict], runs: list[str], out: Path, tasks: dict | None = None) -> list[Path]:
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
        default = next(
            (r for r in rows if r["length"] == length and r["ratio"] == DEFAULT and r["variant"] == "default"), None
        )
        if row is None or default is None:
            lines.append(f"| {length} | - | - | - |")
        else:
            lines.append(
                f"| {length} | {row['ratio']} | {row['kept_tokens']:.0f} | "
                f"{row['kept_all']}/{row['samples']} / {default['kept_all']}/{default['samples']} |"
            )
    tried = rules(rows)
    lines += [
        "",
        f"Budget rules (`keep_growth=g`): tokens kept growing as length ** g past 4096 tokens, keep {DEFAULT} up to "
        f"there (keep ratio {DEFAULT} x min(1, (length / 4096) ** (g - 1))): the rule's own run where there is one "
        "(\"run\" and its ratio), else rounded up to a measured ratio; a rule holds at a length "
        "when it keeps as many samples as the default less at most one. The ratio at 131072 tokens is the "
        "rule's own (what the roofline at 128K takes).",
        "",
        "| g | " + " | ".join(f"{length}: ratio, kept / default" for length in sorted({r["length"] for r in tried}))
        + " | holds everywhere | ratio at 131072 |",
        "|---|" + "---|" * (len({r["length"] for r in tried}) + 2),
    ]
    for growth in GROWTHS:
        mine = [r for r in tried if r["growth"] == growth]
        cells = [
            f"{'run ' + format(r['rule_ratio'], '.3f') if r['measured_ratio'] is None else format(r['measured_ratio'], 'g')}, "
            f"{r['kept_all']}/{r['default_kept_all']} of {r['samples']}"
            for r in mine
        ]
        lines.append(f"| {growth:g} | " + " | ".join(cells) + f" | {all(r['holds'] for r in mine)} | "
                     f"{rule_ratio(growth, 131072):.3f} |")
    if tasks:
        names = sorted({task for cell in tasks.values() for task in cell})
        lines += ["", "Samples with every answer span kept, per task:", "",
                  "| length | setting | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for (length, setting), cell in tasks.items():
            lines.append(f"| {length} | {setting} | " + " | ".join(cell.get(n, "-") for n in names) + " |")
    lines += [
        "",
        "| length | scoring | setting | samples | every span kept | span recall | kept tokens (median) | kept share "
        "| tasks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['length']} | {r['variant']} | {r['setting']} | {r['samples']} | {r['kept_all']}/{r['samples']} | "
            f"{r['recall']:.3f} | {r['kept_tokens']:.0f} | {r['kept_share']:.3f} | {', '.join(r['tasks'])} |"
        )
    md, data = out.with_suffix(".md"), out.with_suffix(".json")
    _atomic_write(md, "\n".join(lines) + "\n")
    _atomic_write(data, json.dumps({"runs": runs, "rows": rows, "smallest_ratio": best, "rules": tried}, indent=1))
    written = [md, data]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    kinds_all = sorted({r["variant"] for r in rows if not r["variant"].startswith("keep_growth=")}, key=lambda v: v != "default")
    styles = dict(zip(kinds_all, ["o-", "s--", "^:", "D-.", "v--", "P:", "X-."]))  # a line style per scoring, a colour per length
    for colour, length in enumerate(sorted({r["length"] for r in rows})):
        kinds = {r["variant"] for r in rows if r["length"] == length and not r["variant"].startswith("keep_growth=")}
        for kind in sorted(kinds, key=lambda v: v != "default"):
            mine = [r for r in rows if r["length"] == length and r["ratio"] is not None and r["variant"] == kind]
            mine.sort(key=lambda r: r["ratio"])
            x = [r["kept_tokens"] for r in mine]
            label = f"~{length // 1000}K" + ("" if kind == "default" else f" {kind}")
            style = dict(color=f"C{colour}", alpha=1.0 if kind == "default" else 0.7)
            axes[0].plot(x, [r["kept_all"] / r["samples"] for r in mine], styles[kind], label=label, **style)
            axes[1].plot(x, [r["recall"] for r in mine], styles[kind], **style)
        mine = [r for r in rows if r["length"] == length and r["ratio"] is not None and r["variant"] == "default"]
        for r in mine:
            axes[0].annotate(f"{r['ratio']:g}", (r["kept_tokens"], r["kept_all"] / r["samples"]), fontsize=7)
    axes[0].set_ylabel("samples with every answer span kept")
    axes[1].set_ylabel("mean answer-span recall")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("tokens kept (median; points: keep ratio)")
        ax.grid(alpha=0.3)
    fig.legend(loc="center right", fontsize=7)
    fig.subplots_adjust(right=0.78)
    fig.suptitle("SpecPrefill keep budget vs prompt length (RULER selection proxy)\n" + "\n".join(runs), fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    png = out.with_suffix(".png")
    part = png.with_name(png.name + ".part")
    fig.savefig(part, dpi=120, format="png")
    part.replace(png)
    return [*written, png]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="path without suffix (.md, .json, .png written)")
    args = parser.parse_args()
    records, runs = load(args.records)
    for path in write(table(records), runs, args.out, per_task(records)):
        print(path)


if __name__ == "__main__":
    main()
