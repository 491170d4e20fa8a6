"""What `specfill eval` writes: JSON, Markdown (tables with speed-ups), the trade-off plot and the
kept-token maps (evaluation/plots.py draws them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .machine import report_head
from .plots import plot_saved_maps, plot_tradeoff
from .ruler_report import loss_causes, or_dash, ruler_markdown, write_ruler_plots

RETRIEVAL_HEADINGS = {
    "passkey": "Passkey retrieval",
    "multikey": "Multi-key needle (four named numbers in the evaluation text, one asked)",
}


def plot_title(result: dict) -> str:
    """Model, dtype, device and threads, as every plot title names them."""
    plan, machine = result["plan"], result["machine"]
    threads = machine.get("torch_threads")
    return (
        f"{Path(str(plan['model'])).name}, {machine.get('model_dtype', plan.get('dtype') or 'default dtype')}, "
        f"{plan['backend']} on {machine.get('device_name', plan.get('device') or 'default device')}"
        + (f", {threads} thread(s)" if threads else "")
        + f" ({machine['cpu'][:28]})"
    )


def eval_markdown(result: dict) -> list[str]:
    plan = result["plan"]
    lines = [
        *report_head("Quality evaluation", result, "cells"),
        f"Model: {plan['model']}, backend {plan['backend']}, {result['machine'].get('model_dtype', '')}; "
        f"H2O S={plan['h2o']['chunk_size']} L={plan['h2o']['local']} H={plan['h2o']['heavy']} "
        f"W={plan['h2o'].get('dense_tail', 0)}; SpecPrefill speculator {plan['speculator']}, layers "
        f"{plan['specprefill'].get('layers', 'all')}. Defaults (marked * in the tables and the plot): "
        f"{', '.join(plan.get('defaults', [])) or '-'}.",
        "",
    ]
    star = lambda label: label + (" *" if label in plan.get("defaults", []) else "")  # noqa: E731
    if result["perplexity"]:
        lines += [
            "## Perplexity (GPL-3 + GFDL-1.3 text)",
            "",
            "| method | tokens | perplexity | vs full | prefill (s) | speed-up |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {star(r['method'])} | {r['tokens']} | {r['perplexity']:.4f} | {or_dash(r['vs_full_pct'], '{:+.2f}%')} "
            f"| {or_dash(r.get('prefill_s'), '{:.2f}')} | {or_dash(r.get('speedup_vs_full'), '{:.2f}x')} |"
            for r in result["perplexity"]
        ]
    for task, heading in RETRIEVAL_HEADINGS.items():
        if not result.get(task):
            continue
        lines += [
            "",
            f"## {heading}",
            "",
            "| method | tokens | trials | accuracy (hits) | vs full (points) | median TTFT (s) | speed-up |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {star(r['method'])} | {r['tokens']} | {r['trials']} | {100 * r['accuracy']:.0f}% ({r['hits']}) "
            f"| {or_dash(r['vs_full_points'], '{:+.0f}')} | {or_dash(r.get('median_ttft_s'), '{:.2f}')} "
            f"| {or_dash(r.get('speedup_vs_full'), '{:.2f}x')} |"
            for r in result[task]
        ]
    return lines + ruler_markdown(result)


def write_eval(result: dict, out_dir, name: str = "eval") -> list[Path]:
    """<name>.json, <name>.md, <name>_tradeoff.png (speed-up vs quality change, one point per
    method and setting) and, when maps were recorded, <name>_positions.png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    compact = {
        **result,
        "maps": {k: "see PNG" for k in result["maps"]},
        "ruler_maps": {k: "see PNG" for k in result.get("ruler_maps", {})},
        "ruler_loss_causes": loss_causes(result),
    }
    for path, text in (
        (paths[0], json.dumps(compact, indent=1) + "\n"),
        (paths[1], "\n".join(eval_markdown(result)) + "\n"),
    ):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        os.replace(partial, path)
    title = plot_title(result)
    retrieval = {task: result.get(task, []) for task in RETRIEVAL_HEADINGS}
    if any(r.get("speedup_vs_full") for r in sum(retrieval.values(), []) + result["perplexity"]):
        paths.append(
            plot_tradeoff(
                retrieval,
                result["perplexity"],
                result["plan"].get("defaults", []),
                out / f"{name}_tradeoff.png",
                f"Speed-up vs quality: {title}",
            )
        )
    paths += plot_saved_maps(
        result["maps"],
        result.get("map_marks", {}),
        out / f"{name}_positions.png",
        f"kept (SpecPrefill) / in the last memory set (H2O), mid-depth needle: {title}",
    )
    return paths + write_ruler_plots(result, out, name, title)
