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
    path = Path(path)
    partial = path.with_name(path.stem + ".partial.png")
    fig.savefig(partial, dpi=120, bbox_inches="tight")
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


def plot_position_map(maps: dict[str, np.ndarray], path: str | os.PathLike, title: str) -> Path:
    """One row per label: which prompt positions were kept (SpecPrefill) or are in a memory
    set (H2O: fraction of (layer, KV head) memory sets holding the position)."""
    plt = _pyplot()
    labels = list(maps)
    width = max(len(m) for m in maps.values())
    image = np.zeros((len(labels), width))
    for i, label in enumerate(labels):
        image[i, : len(maps[label])] = maps[label]
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(labels)))
    shown = ax.imshow(image, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("prompt position")
    ax.set_title(title)
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
