"""The conformance report: JSON for machines, Markdown for people."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from specfill.core.tolerances import TOLERANCES

from .runner import Report


def write_reports(report: Report, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Writes conformance-<backend>.json and .md into out_dir (each atomically)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"conformance-{report.backend}"
    payload = {
        "backend": report.backend,
        "dtypes": report.dtypes,
        "kernels": report.kernels,
        "passed": report.passed,
        "n_checks": len(report.results),
        "n_failed": len(report.failures),
        "seconds": round(report.seconds, 3),
        "machine": report.machine,
        "tolerances": {d: vars(t) for d, t in TOLERANCES.items() if d in report.dtypes},
        "results": [r.to_dict() for r in report.results],
    }
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    _write_atomic(json_path, json.dumps(payload, indent=1) + "\n")
    _write_atomic(md_path, render_markdown(report))
    return json_path, md_path


def render_markdown(report: Report) -> str:
    verdict = "PASS" if report.passed else "FAIL"
    lines = [
        f"# Conformance: backend `{report.backend}` — {verdict}",
        "",
        f"{len(report.results)} checks, {len(report.failures)} failed, dtypes "
        f"{', '.join(report.dtypes)}, kernels {report.kernels}, {report.seconds:.2f} s on {report.machine}.",
        "",
        "| stage check | dtype | cases | failed | max error | tolerance |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for r in report.results:
        groups[(r.check, r.dtype)].append(r)
    for (check, dtype), rows in groups.items():
        errors = [r.max_error for r in rows if r.max_error is not None]
        worst = f"{max(errors):.2e}" if errors else "-"
        tolerance = rows[0].tolerance + (f": {rows[0].detail}" if rows[0].tolerance == "skipped" else "")
        lines.append(f"| {check} | {dtype} | {len(rows)} | {sum(not r.passed for r in rows)} | {worst} | {tolerance} |")
    if report.failures:
        lines += ["", "## Failures", ""]
        lines += [
            f"- `{r.check}` [{r.dtype}] case `{r.case}`: {r.detail or 'mismatch'}"
            + (f" (max error {r.max_error:.3g})" if r.max_error is not None else "")
            for r in report.failures
        ]
    lines += ["", "## Tolerances", "", "| dtype | atol | rtol | memory-set Jaccard | why |", "|---|---|---|---|---|"]
    lines += [
        f"| {d} | {t.atol:g} | {t.rtol:g} | {t.memory_jaccard:g} | {t.why} |"
        for d, t in TOLERANCES.items()
        if d in report.dtypes
    ]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
