"""What `specfill eval` writes for RULER's tasks: the per-task table, why each sample a method
lost against full prefill was lost, the trade-off plot (speed-up vs score, one panel per task)
and the maps of what was kept."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .plots import _pyplot, _save, plot_saved_maps

DROPPED_BELOW = 0.5  # an answer span with less than this share of its tokens kept counts as dropped


def loss_causes(result: dict) -> list[dict]:
    """Per sample a sparse method scored below full prefill on: the cause. SpecPrefill (fewer
    tokens kept than the prompt holds): "dropped" when some answer span ("needle") kept less than
    half its tokens (selection lost it), else "kept, misread" (RoPE gaps, fragmented context).
    H2O keeps every token's KV (computed with sparse attention): "kept, misread", with the share
    of last memory sets holding the answer spans. "no span" for tasks without one (words)."""
    full = {
        (r["task"], r["tokens"], r["index"]): r["score"]
        for r in result.get("ruler_samples", [])
        if r["method"] == "full"
    }
    out = []
    for r in result.get("ruler_samples", []):
        base = full.get((r["task"], r["tokens"], r["index"]))
        if r["method"] == "full" or base is None or r["score"] >= base:
            continue
        shares = r.get("needle_kept") or []
        dropping = r["kept_tokens"] < r["prompt_tokens"]
        cause = "no span" if not shares else "dropped" if dropping and min(shares) < DROPPED_BELOW else "kept, misread"
        out.append(
            {
                **{k: r[k] for k in ("task", "tokens", "method", "index", "score", "prediction", "expected")},
                "full_score": base,
                "cause": cause,
                "needle_kept": shares,
            }
        )
    return out


def or_dash(value: float | None, pattern: str) -> str:
    """value in `pattern`, or "-" for None (a table cell)."""
    return "-" if value is None else pattern.format(value)


def ruler_markdown(result: dict) -> list[str]:
    """The RULER sections of the eval report (empty when no RULER task ran)."""
    rows = result.get("ruler", [])
    if not rows:
        return []
    plan = result["plan"]
    lines = [
        "",
        "## RULER tasks (RULER's scoring: share of expected strings found; QA: any)",
        "",
        f"Samples per cell: {min(r['samples'] for r in rows)}-{max(r['samples'] for r in rows)}; "
        f"prompt lengths {plan.get('ruler_lengths')} tokens (at most); "
        f"chat template {'on' if plan.get('chat_template') else 'off'}; seed {plan.get('ruler_seed')}; "
        f"load average at the end {result['machine'].get('load_average_1min_at_end', '-')}.",
        "",
        "| task | tokens | method | samples | score | vs full (points) | median TTFT (s) | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['task']} | {r['tokens']} | {r['method']} | {r['samples']} | {r['score']:.0f} "
        f"| {or_dash(r.get('vs_full_points'), '{:+.0f}')} | {r['median_ttft_s']:.2f} "
        f"| {or_dash(r.get('speedup_vs_full'), '{:.2f}x')} |"
        for r in rows
    ]
    lines += [
        "",
        "Mean over tasks:",
        "",
        "| method | tokens | mean score | vs full (points) | worst task vs full |",
        "|---|---|---|---|---|",
    ]
    for method, tokens in dict.fromkeys((r["method"], r["tokens"]) for r in rows):
        cell = [r for r in rows if r["method"] == method and r["tokens"] == tokens]
        deltas = [r["vs_full_points"] for r in cell if r.get("vs_full_points") is not None]
        lines.append(
            f"| {method} | {tokens} | {np.mean([r['score'] for r in cell]):.1f} "
            f"| {or_dash(np.mean(deltas) if deltas else None, '{:+.1f}')} "
            f"| {or_dash(min(deltas) if deltas else None, '{:+.0f}')} |"
        )
    return lines + _causes_markdown(loss_causes(result))


def _causes_markdown(causes: list[dict]) -> list[str]:
    if not causes:
        return ["", "No sample scored below full prefill."]
    lines = [
        "",
        "## Why the losses (each sample scored below full prefill)",
        "",
        f"dropped: an answer span kept less than {DROPPED_BELOW:.0%} of its tokens (SpecPrefill); kept, misread: "
        "every answer span kept (H2O always keeps the KV; its share is of last memory sets).",
        "",
        "| task | tokens | method | sample | score / full | cause | answer spans kept | answer (start) | expected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in causes:
        shares = ", ".join(f"{s:.2f}" for s in c["needle_kept"]) or "-"
        answer = c["prediction"][:60].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {c['task']} | {c['tokens']} | {c['method']} | {c['index']} | {c['score']:.2f} / "
            f"{c['full_score']:.2f} | {c['cause']} | {shares} | {answer} | {', '.join(c['expected'])[:60]} |"
        )
    return lines


def plot_ruler_tradeoff(rows: list[dict], defaults: list[str], path: str | os.PathLike, title: str) -> Path:
    """One panel per task: TTFT speed-up vs full (x) against RULER score (y, 0-100), one point per
    (method and setting, length); defaults as stars."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cols = min(4, len(tasks))
    fig, axes = plt.subplots(
        (len(tasks) + cols - 1) // cols,
        cols,
        figsize=(4.2 * cols, 3.6 * ((len(tasks) + cols - 1) // cols)),
        squeeze=False,
    )
    colors: dict[str, str] = {}
    for ax, task in zip(axes.flat, tasks):
        for r in (r for r in rows if r["task"] == task and r.get("speedup_vs_full")):
            color, star = colors.setdefault(r["method"], f"C{len(colors) % 10}"), r["method"] in defaults
            ax.scatter(
                r["speedup_vs_full"],
                r["score"],
                color=color,
                marker="*" if star else "o",
                s=140 if star else 40,
                edgecolors="black",
                linewidths=0.5,
            )
            ax.annotate(
                str(r["tokens"]),
                (r["speedup_vs_full"], r["score"]),
                fontsize=7,
                xytext=(4, 3),
                textcoords="offset points",
            )
        ax.set_title(task, fontsize=9)
        ax.set_ylim(-5, 105)
        ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("TTFT speed-up vs full (x)", fontsize=8)
        ax.set_ylabel("RULER score", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    handles = [
        plt.Line2D([], [], color=c, marker="*" if m in defaults else "o", linestyle="", label=m)
        for m, c in colors.items()
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, max(1, len(handles))), fontsize=8)
    fig.suptitle(title + "\n(labels: prompt tokens)", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, path)


def write_ruler_plots(result: dict, out: Path, name: str, title: str) -> list[Path]:
    """<name>_ruler_tradeoff.png and, when maps were recorded, <name>_ruler_positions.png."""
    paths = []
    rows = result.get("ruler", [])
    if any(r.get("speedup_vs_full") for r in rows):
        paths.append(
            plot_ruler_tradeoff(
                rows,
                result["plan"].get("defaults", []),
                out / f"{name}_ruler_tradeoff.png",
                f"RULER score vs speed-up: {title}",
            )
        )
    return paths + plot_saved_maps(
        result.get("ruler_maps"),
        result.get("ruler_marks", {}),
        out / f"{name}_ruler_positions.png",
        f"kept (SpecPrefill) / in the last memory set (H2O), first lost sample (#index) else #0: {title}",
    )
