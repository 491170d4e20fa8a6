"""PNG plots for results a person would rather look at (matplotlib, headless)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> Path:
    """Write the figure atomically, then close it (pyplot keeps every open figure: a long bench or eval
    process would hold each plot it drew)."""
    path = Path(path)
    partial = path.with_name(path.stem + ".partial.png")
    try:
        fig.savefig(partial, dpi=120, bbox_inches="tight")
    finally:
        _pyplot().close(fig)
    os.replace(partial, path)
    return path


def plot_ttft(rows: Sequence[dict], path: str | os.PathLike, title: str) -> Path:
    """TTFT (s) vs prompt length, one line per (backend, method); rows carry backend, method,
    prompt_tokens and ttft_s."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        series.setdefault((row["backend"], row["method"]), []).append((row["prompt_tokens"], row["ttft_s"]))
    for (backend, method), points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{backend} {method}")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_saved_maps(maps: dict | None, marks: dict, path: str | os.PathLike, title: str) -> list[Path]:
    """[plot_position_map of a result's saved maps (lists, as the JSON holds them)], or [] when it has none."""
    if not maps:
        return []
    return [plot_position_map({k: np.asarray(v) for k, v in maps.items()}, marks, path, title)]


def plot_position_map(
    maps: dict[str, np.ndarray], marks: dict[str, dict[str, list[int]]], path: str | os.PathLike, title: str
) -> Path:
    """One row per label: which prompt positions were kept (SpecPrefill) or are in a memory
    set (H2O: fraction of (layer, KV head) memory sets holding the position). A row ends at its
    own prompt's end (no padding drawn for shorter prompts); marks[label][kind], a span [start,
    end) or a list of spans, is drawn under the row: "needle" (what the answer is read from, red),
    "question" (orange), "other" (distractor needles, grey), "support" (QA's gold documents, pink)."""
    plt = _pyplot()
    labels = list(maps)
    width = max(len(m) for m in maps.values())
    image = np.full((len(labels), width), np.nan)
    for i, label in enumerate(labels):
        image[i, : len(maps[label])] = maps[label]
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.55 * len(labels)))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # past a shorter prompt's end
    shown = ax.imshow(
        np.ma.masked_invalid(image), aspect="auto", interpolation="nearest", cmap=cmap, vmin=0.0, vmax=1.0
    )
    shown_kinds: set[str] = set()
    for i, label in enumerate(labels):
        for what, color, y in (
            ("support", "pink", 0.30),
            ("other", "grey", 0.42),
            ("needle", "red", 0.42),
            ("question", "orange", 0.42),
        ):
            spans = marks.get(label, {}).get(what) or []
            for span in [spans] if spans and not isinstance(spans[0], (list, tuple)) else spans:
                end = max(span[1], span[0] + width / 150)  # at least 1/150 of the width: a short span shows
                ax.plot(
                    [span[0] - 0.5, end - 0.5],
                    [i + y, i + y],
                    color=color,
                    linewidth=4,
                    solid_capstyle="butt",
                    label=None if what in shown_kinds else what,
                )
                shown_kinds.add(what)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("prompt position")
    ax.set_title(title, fontsize=9)
    if marks:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.4 / len(labels)), ncol=4, fontsize=8)
    fig.colorbar(shown, ax=ax, fraction=0.02, label="kept / in memory")
    return _save(fig, path)


def plot_decode_speed(rows: Sequence[dict], path: str | os.PathLike, title: str) -> Path:
    """Decode tokens/s vs draft size k (k = 0: plain decoding), one line per prefill method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in sorted({r["method"] for r in rows}):
        points = sorted((r["k"], r["decode_tps"]) for r in rows if r["method"] == method)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"after {method} prefill")
    ax.set_xlabel("draft tokens per round k (0 = plain decoding)")
    ax.set_ylabel("decode tokens / s")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_tradeoff(
    retrieval: dict[str, Sequence[dict]],
    perplexity: Sequence[dict],
    defaults: Sequence[str],
    path: str | os.PathLike,
    title: str,
) -> Path:
    """TTFT speed-up vs full (x) against accuracy change in points, one panel per retrieval task
    (task name -> rows), and perplexity change in % (last panel): one point per (method and
    setting, prompt length); the library's default settings drawn as stars, the others as circles."""
    plt = _pyplot()
    panels = [
        (rows, key, label)
        for rows, key, label in [
            (rows, "vs_full_points", f"{task} accuracy vs full (points)") for task, rows in retrieval.items()
        ]
        + [(perplexity, "vs_full_pct", "perplexity vs full (%)")]
        if rows
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    colors: dict[str, str] = {}
    for ax, (rows, key, ylabel) in zip(axes[0], panels):
        values = [r[key] for r in rows if r.get(key) is not None] or [0.0]
        ax.set_ylim(min(min(values), -10.0) - 3.0, max(max(values), 0.0) + 3.0)  # a flat 0 stays readable
        for r in rows:
            if r.get("speedup_vs_full") is None or r.get(key) is None:
                continue
            color = colors.setdefault(r["method"], f"C{len(colors) % 10}")
            ax.scatter(
                r["speedup_vs_full"],
                r[key],
                color=color,
                s=150 if r["method"] in defaults else 45,
                marker="*" if r["method"] in defaults else "o",
                edgecolors="black",
                linewidths=0.5,
            )
            ax.annotate(
                f"{r['tokens']}", (r["speedup_vs_full"], r[key]), fontsize=7, xytext=(4, 3), textcoords="offset points"
            )
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.axvline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("TTFT speed-up vs full prefill (x)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = [
        plt.Line2D(
            [],
            [],
            color=c,
            marker="*" if m in defaults else "o",
            linestyle="",
            markersize=10 if m in defaults else 6,
            label=m + (" (default)" if m in defaults else ""),
        )
        for m, c in colors.items()
    ]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(4, max(1, len(handles))),
        fontsize=8,
        bbox_to_anchor=(0.5, -0.02 - 0.04 * ((len(handles) - 1) // 4)),
    )
    fig.suptitle(title + "\n(labels: prompt tokens)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06 + 0.04 * ((len(handles) - 1) // 4), 1, 1))
    return _save(fig, path)


def plot_agent_session(turns: Sequence[dict], restart: Sequence[dict], path: str | os.PathLike, title: str) -> Path:
    """TTFT (s) per turn of the agent session (evaluation/agent_session.py): cold (no prompt cache),
    cached (the session as played) and after a server restart (the cache read back from disk)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {
        "cold (prompt cache off)": [(t["turn"], t["cold"]["ttft_s"]) for t in turns],
        "cached (the session)": [(t["turn"], t["cached"]["ttft_s"]) for t in turns],
        "after restart (last turn first: from --prompt-cache-dir)": [(r["turn"], r["ttft_s"]) for r in restart],
    }
    for label, points in series.items():
        points = [p for p in points if p[1] is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("turn")
    ax.set_ylabel("time to first token (s)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, path)


def plot_agent_turns(runs: dict, path: str | os.PathLike, title: str) -> Path:
    """TTFT (s) per turn and method over a cached conversation (evaluation/agent_turns.py): one bar per
    method and turn, labelled with the turn's new tokens; a hatched bar: the turn's fact was missed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(runs))
    for i, (method, run) in enumerate(runs.items()):
        rows = [r for r in run["turns"] if r["ttft_s"] is not None]
        xs = [r["turn"] + (i - (len(runs) - 1) / 2) * width for r in rows]
        bars = ax.bar(xs, [r["ttft_s"] for r in rows], width, label=method)
        for bar, r in zip(bars, rows):
            if not r["answered"]:
                bar.set_hatch("//")
    turns = sorted({r["turn"] for run in runs.values() for r in run["turns"]})
    first = next(iter(runs.values()))["turns"]
    new = {r["turn"]: r["new_tokens"] for r in first}
    ax.set_xticks(turns, [f"turn {t}\n{new.get(t)} new" for t in turns])
    ax.set_ylabel("time to first token over the cached conversation (s)")
    ax.set_title(title + "\n(hatched: the turn's fact missed)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    return _save(fig, path)


def plot_soak_memory(
    samples: Sequence[tuple[float, float, str]], marks: dict, memory: dict, path: str | os.PathLike, title: str
) -> Path:
    """The server's resident memory (MB) over a soak (evaluation/soak.py): samples (seconds, MB, phase),
    the phases' starts as vertical lines, and the memory check's allowance as a dashed line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([s[0] for s in samples], [s[1] for s in samples], color="tab:blue", label="resident memory")
    for name, at in marks.items():
        ax.axvline(at, color="grey", linestyle=":", linewidth=1)
        ax.annotate(name, (at, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", fontsize=7)
    allowed = memory.get("allowed_mb")
    if allowed is not None and allowed <= 1.5 * max(s[1] for s in samples):
        ax.axhline(allowed, color="tab:red", linestyle="--", label="allowed after the load")
    elif allowed is not None:  # far above: drawn, it would flatten the curve
        ax.plot([], [], " ", label=f"allowed after the load: {allowed:.0f} MB")
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _save(fig, path)
