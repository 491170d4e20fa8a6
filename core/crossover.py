"""`method="auto"`: full prefill below a crossover prompt length, the sparse method above it.

The crossover is measured: `specfill bench` writes, next to its results, `crossover.json` with
one entry per (backend, device, sparse method): the shortest measured prompt length from which
that method's TTFT beat full prefill at every measured length (see `crossovers_from_rows`). At
run time the threshold comes from, in order: an explicit `auto_threshold`; the file named by
$SPECFILL_CROSSOVER, else this source tree's results/bench/crossover.json, for the model's
backend and device; else FALLBACK_CROSSOVER, documented below. A measured entry with no
crossover (the sparse method never won) keeps auto on full prefill at every length.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from .errors import ConfigError

CROSSOVER_FILE = "crossover.json"
# No measurement for this backend and device: 2048 tokens, the shortest prompt at which both
# H2O (S=1024) and SpecPrefill (self:8, keep 0.1) beat full prefill in every bench of results/bench
# (torch on CPU, 1 and 2 threads); at or below one H2O chunk (1024) H2O IS full attention anyway.
FALLBACK_CROSSOVER = 2048


def crossover_path() -> Path:
    """$SPECFILL_CROSSOVER, else <source tree>/results/bench/crossover.json."""
    override = os.environ.get("SPECFILL_CROSSOVER")
    return Path(override) if override else Path(__file__).resolve().parents[1] / "results" / "bench" / CROSSOVER_FILE


def read_crossovers(path: Path | None = None) -> list[dict]:
    """The entries of a crossover file ([] when there is none); a corrupt file is an error."""
    path = path or crossover_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["entries"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"crossover file {path} is unreadable ({err}): fix it or set --auto-threshold") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"crossover file {path}: 'entries' must be a list of objects")
    return entries


def auto_threshold(backend: str, device: str, sparse: str, entries: Iterable[dict] | None = None) -> tuple[int | None, str]:
    """(prompt tokens from which auto runs `sparse`, where that figure came from). None: never
    (measured, and the sparse method never beat full prefill)."""
    for entry in read_crossovers() if entries is None else entries:
        if (entry.get("backend"), entry.get("device"), entry.get("method")) == (backend, device, sparse):
            value = entry.get("crossover_tokens")
            return (None if value is None else int(value)), f"measured ({entry.get('source', 'bench')})"
    return FALLBACK_CROSSOVER, "fallback (no measurement for this backend and device)"


def crossovers_from_rows(rows: Iterable[dict], source: str) -> list[dict]:
    """Crossover entries from bench rows (backend, device, method, prompt_tokens,
    ttft_speedup_vs_full): per (backend, device, sparse method), the shortest measured length L
    with a speed-up >= 1 at L and at every longer measured length; None when the longest
    measured length is still slower than full prefill."""
    series: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for r in rows:
        if r["method"] != "full" and r.get("ttft_speedup_vs_full") is not None:
            key = (r["backend"], r.get("device", "unknown"), r["method"])
            series.setdefault(key, []).append((int(r["prompt_tokens"]), float(r["ttft_speedup_vs_full"])))
    entries = []
    for (backend, device, method), points in sorted(series.items()):
        points.sort()
        crossover = None
        for length, speedup in reversed(points):
            if speedup < 1.0:
                break
            crossover = length
        entries.append({"backend": backend, "device": device, "method": method, "crossover_tokens": crossover,
                        "measured": {str(n): round(s, 3) for n, s in points}, "source": source})
    return entries


def merge_crossovers(path: Path, new: list[dict], machine: dict[str, Any]) -> Path:
    """Write `new` into the crossover file at `path`, replacing entries of the same (backend,
    device, method) and keeping the others; each entry records the machine line it came from."""
    key = lambda e: (e.get("backend"), e.get("device"), e.get("method"))  # noqa: E731
    fresh = {key(e): {**e, "machine": machine} for e in new}
    kept = [e for e in read_crossovers(path) if key(e) not in fresh]
    text = json.dumps({"about": __doc__.strip().splitlines()[0], "entries": kept + list(fresh.values())}, indent=1)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path
