"""What scripts/ruler_fix.py's records say: per task and setting the RULER score, TTFT and
speed-up vs full prefill, how much of the answer's spans each setting kept (selection recall,
known even where no answer was decoded), why each loss happened, and the plots (speed-up vs score
and kept share vs answer recall per task; the positions map of every setting on one sample)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .plots import _pyplot, _save, plot_position_map
from .ruler_fix import classify, expand_map
from .ruler_report import DROPPED_BELOW


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def summarize(records: list[dict]) -> list[dict]:
    """One row per (task, setting): samples decoded, mean score (0-100), mean kept share of the
    prompt, answer recall (mean over samples of the least-kept answer span's share), samples
    with every answer span kept, median TTFT and the speed-up over full's median TTFT."""
    classify(records)
    rows = []
    for task in dict.fromkeys(r["task"] for r in records):
        cell = [r for r in records if r["task"] == task]
        full = _median([r["ttft_s"] for r in cell if r["setting"] == "full"])
        for setting in dict.fromkeys(r["setting"] for r in cell):
            mine = [r for r in cell if r["setting"] == setting]
            scored = [r for r in mine if r["score"] is not None]
            spans = [min(r["answer_kept"]) for r in mine if r.get("answer_kept") and setting != "full"]
            ttft = _median([r["ttft_s"] for r in scored])
            rows.append({"task": task, "setting": setting, "samples": len(mine), "decoded": len(scored),
                         "score": 100.0 * float(np.mean([r["score"] for r in scored])) if scored else None,
                         "kept_share": float(np.mean([r["kept_tokens"] / r["prompt_tokens"] for r in mine])),
                         "answer_recall": float(np.mean(spans)) if spans else None,
                         "all_spans_kept": sum(s >= DROPPED_BELOW for s in spans) if spans else None,
                         "median_ttft_s": ttft,
                         "speedup": full / ttft if full and ttft and setting != "full" else None,
                         "causes": {c: sum(r.get("cause") == c for r in scored) for c in ("selection", "misread")}})
    return rows


def _f(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def markdown(rows: list[dict], records: list[dict], header: list[str]) -> list[str]:
    """The tables: per task and setting, then every loss against full prefill with its cause."""
    lines = header + ["", "| task | setting | samples (decoded) | score | kept share | answer recall | "
                          "samples with every answer span kept | median TTFT (s) | speed-up vs full | losses: selection / misread |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        causes = r["causes"]
        lines.append(f"| {r['task']} | {r['setting']} | {r['samples']} ({r['decoded']}) | {_f(r['score'], '{:.0f}')} "
                     f"| {r['kept_share']:.3f} | {_f(r['answer_recall'], '{:.2f}')} "
                     f"| {_f(r['all_spans_kept'], '{}')}/{r['samples']} | {_f(r['median_ttft_s'], '{:.0f}')} "
                     f"| {_f(r['speedup'], '{:.2f}x')} | {causes['selection']} / {causes['misread']} |")
    losses = [r for r in records if r.get("cause")]
    lines += ["", f"Losses against full prefill (selection: an answer span kept < {DROPPED_BELOW:.0%}; "
                  "misread: every span kept, answer still wrong):", ""]
    if not losses:
        return lines + ["None among the samples with a full-prefill record."]
    lines += ["| task | sample | setting | score / full | cause | answer spans kept | answer (start) |", "|---|---|---|---|---|---|---|"]
    for r in losses:
        shares = ", ".join(f"{s:.2f}" for s in r.get("answer_kept") or []) or "-"
        answer = r["prediction"][:50].replace("|", "/").replace("\n", " ")
        lines.append(f"| {r['task']} | {r['index']} | {r['setting']} | {r['score']:.2f} / {r['full_score']:.2f} "
                     f"| {r['cause']} | {shares} | {answer} |")
    return lines


def plot_fix(rows: list[dict], path: Path, title: str) -> Path:
    """Per task two panels: score (y) against speed-up vs full (x; kept share of the prompt where
    the task has no full-prefill record), left out when nothing was decoded (selection-only
    records); and kept share of the prompt (x) against
    answer recall (y) for every setting. Settings differ by colour and marker (20 x 4 styles)."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    decoded = any(r["score"] is not None for r in rows)
    panels = ("top", "bottom") if decoded else ("bottom",)
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    legend_rows = -(-len(settings) // 4)
    legend_in = 0.2 * legend_rows + 0.35  # inches the legend takes below the panels
    height = 3.7 * len(panels) + legend_in
    fig, axes = plt.subplots(len(panels), len(tasks), figsize=(4.6 * len(tasks), height), squeeze=False)
    cmap = plt.get_cmap("tab20")
    style = {s: (cmap(i % 20), "osD^"[i // 20 % 4]) for i, s in enumerate(settings)}
    for col, task in enumerate(tasks):
        ax = dict(zip(panels, (axes[row][col] for row in range(len(panels)))))
        timed = any(r["speedup"] is not None for r in rows if r["task"] == task)
        for r in (r for r in rows if r["task"] == task):
            color, marker = style[r["setting"]]
            x = r["speedup"] if timed else r["kept_share"]
            if decoded and x is not None and r["score"] is not None:
                ax["top"].scatter(x, r["score"], color=color, marker=marker, s=45, edgecolors="black", linewidths=0.5)
            if r["answer_recall"] is not None:
                ax["bottom"].scatter(r["kept_share"], r["answer_recall"], color=color, marker=marker, s=45,
                                     edgecolors="black", linewidths=0.5)
        full = next((r for r in rows if r["task"] == task and r["setting"] == "full" and r["score"] is not None), None)
        if decoded:
            if full:
                ax["top"].axhline(full["score"], color="grey", linestyle="--", linewidth=0.8, label="full prefill")
            ax["top"].set(title=f"{task}: score vs {'speed-up' if timed else 'kept share (no full record)'}",
                          xlabel="TTFT speed-up vs full (x)" if timed else "kept share of the prompt",
                          ylabel="RULER score", ylim=(-5, 105))
        ax["bottom"].set(title=f"{task}: what selection kept", xlabel="kept share of the prompt",
                         ylabel="answer recall (least-kept span)", ylim=(-0.05, 1.05))
        for one in ax.values():
            one.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker=m, linestyle="", markeredgecolor="black", label=s)
               for s, (c, m) in style.items()]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, legend_in / height, 1, 1 - 0.35 / height))
    return _save(fig, path)


def plot_positions(records: list[dict], task: str, index: int, path: Path, title: str) -> Path:
    """Every setting's map on one sample (SpecPrefill kept tokens; H2O: share of last memory sets)
    with the answer spans (chain hops / needles / answer sentences, red) and question marked."""
    mine = [r for r in records if r["task"] == task and r["index"] == index and r.get("map")]
    maps = {r["setting"]: expand_map(r["map"]) for r in mine}
    marks = {r["setting"]: r["spans"] for r in mine}
    return plot_position_map(maps, marks, path, title)
