"""The soak's report (evaluation/soak.py): counts by status and action, latency percentiles, memory,
checks and failures, as <name>.json and <name>.md, and <name>_memory.png; each written atomically."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from .machine import machine_line

FAILURES_KEPT = 100


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"n": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1], 3)}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by outcome (the HTTP status, or hang / dropped / hung up / mismatch / truncated) in the load
    and all in all, by action and outcome, latency percentiles of the answered requests by action (and
    streams' first token), and the first failures."""
    load = [r for r in records if r["phase"] == "load"]
    actions: dict[str, Counter] = {}
    for r in load:
        actions.setdefault(r["action"], Counter())[r["outcome"]] += 1
    latency, first = {}, {}
    for action in sorted({r["action"] for r in records}):
        answered = [r for r in records if r["action"] == action and r["outcome"] == "200"]
        if answered:
            latency[action] = percentiles([r["seconds"] for r in answered])
        tokens = [r["first_token_s"] for r in answered if r["first_token_s"] is not None]
        if tokens:
            first[action] = percentiles(tokens)
    failures = [r for r in records if "failure" in r]
    return {
        "requests": len(records),
        "load_requests": len(load),
        "by_outcome": dict(sorted(Counter(r["outcome"] for r in load).items())),
        "by_outcome_all_phases": dict(sorted(Counter(r["outcome"] for r in records).items())),
        "by_action": {a: dict(sorted(c.items())) for a, c in sorted(actions.items())},
        "latency_s": latency,
        "first_token_s": first,
        "failures": len(failures),
        "first_failures": failures[:FAILURES_KEPT],
    }


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def markdown(result: dict[str, Any]) -> str:
    s, summary, memory = result["settings"], result["summary"], result["memory"]
    state = ("passed" if result["passed"] else "FAILED") if result["final"] else "running (partial results)"
    lines = [
        f"# {result['title']}",
        "",
        f"**{state}.** Machine: {machine_line(result['machine'])}. Settings: `{json.dumps(s)}`.",
        f"Server: `{json.dumps(result['server'])}`; /v1/responses: {'yes' if result['responses_route'] else 'no'}.",
        f"Phases (s since the start): `{json.dumps(result['marks'])}`.",
        "",
        "| check | ok | what it found |",
        "|---|---|---|",
    ]
    for name, check in result["checks"].items():
        ok = {True: "yes", False: "**NO**", None: "-"}[check["ok"]]
        lines.append(f"| {name} | {ok} | {check['detail'].replace('|', '/')} |")
    outcomes = summary["by_outcome"]
    lines += ["", f"## The load: {summary['load_requests']} requests", "", "| outcome | requests |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in outcomes.items()]
    lines += ["", "| action | outcomes |", "|---|---|"]
    lines += [f"| {a} | {', '.join(f'{k}: {v}' for k, v in c.items())} |" for a, c in summary["by_action"].items()]
    lines += ["", "Latency of the answered requests (s; first token: streams only):", ""]
    lines += [
        "| action | n | p50 | p90 | p99 | max | first token p50 | p90 | max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for action, p in summary["latency_s"].items():
        f = summary["first_token_s"].get(action, {})
        lines.append(
            f"| {action} | {p['n']} | {p['p50']} | {p['p90']} | {p['p99']} | {p['max']} | "
            f"{f.get('p50', '')} | {f.get('p90', '')} | {f.get('max', '')} |"
        )
    lines += ["", "Resident memory of the server (MB): " + json.dumps(memory), ""]
    quiet = result["quiet"]
    if quiet["not_served"]:
        lines += ["Valid requests the server refused in the quiet run (left out of the load):", ""]
        lines += [f"- `{name}`: {why}" for name, why in quiet["not_served"].items()]
        lines.append("")
    if summary["first_failures"]:
        lines += [f"## Failures ({summary['failures']}; the first 20)", ""]
        for r in summary["first_failures"][:20]:
            lines.append(f"- {r['t']} s, client {r['client']}, {r['action']} `{r['case']}`: {r['failure']}")
        lines.append("")
    return "\n".join(lines)


def write_report(result: dict[str, Any], memory: list[tuple[float, float, str]], stem: Path, png: bool) -> list[Path]:
    """<stem>.json (with the memory samples), <stem>.md, and <stem>_memory.png when png."""
    json_path, md_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".md")
    _replace(json_path, json.dumps({**result, "memory_samples": memory}, indent=1))
    _replace(md_path, markdown(result))
    written = [json_path, md_path]
    if png and memory:
        from .plots import plot_soak_memory

        written.append(
            plot_soak_memory(
                memory, result["marks"], result["memory"], stem.with_name(stem.name + "_memory.png"), result["title"]
            )
        )
    return written
