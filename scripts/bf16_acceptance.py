"""The summary step of scripts/bf16_session.py: every acceptance line of issues 46 and 47 from the
session's files (agent_turns.json, bench_long.json, ruler_16k.json), the roofline's 128K table and the
decoded 4K frontier, with what was measured and whether it holds (None: not measured, or not bf16 on
a CPU with bf16 units), and the speed table of every bench row -> acceptance.{md,json}, bench_ttft.png.

    .venv/bin/python scripts/bf16_session.py --steps summary
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any

from specfill.evaluation.ruler_protocol import write_atomic as write

ROOT = Path(__file__).resolve().parents[1]
ROOFLINE = ROOT / "research" / "roofline" / "results" / "roofline.json"
FRONTIER_4K = ROOT / "results" / "eval" / "ruler" / "frontier" / "decoded_4k.json"
DEFAULTS_4K = ("specprefill max 0.3 (new default)", "h2o first-third (new default)")  # decoded_4k's names
AUTO_NAME = "auto c+h2o"  # the RULER candidate standing for auto's composition ("+h2o": over an H2O speculator)
SPEED_METHODS = ("full", "h2o", "specprefill", "specprefill+h2o", "auto")


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def line(issue: int, text: str, measured: str, holds: bool | None, session: bool = True) -> dict[str, Any]:
    """One acceptance line; session: its figures are this session's runs' (they count in bf16 only)."""
    return {"issue": issue, "line": text, "measured": measured, "holds": holds, "session": session}


def size(tokens: int) -> str:
    """16384 and 16000 -> "16K", 32000 -> "32K"; below 1000 the count itself."""
    return f"{round(tokens / 1000)}K" if tokens >= 1000 else str(tokens)


def turns_lines(data: dict | None, threshold: int) -> list[dict]:
    """Issue 46's two lines a run of evaluation/agent_turns measures."""
    speed = (
        "SpecPrefill on the new part >= 1.4x full's TTFT on turns whose new part is >= 4K tokens, the "
        "per-turn fact answered as full answers it (minus at most one)"
    )
    exact = "every turn after a rebuilt one reuses the whole previous conversation; the follow-up equals a dense run's"
    runs = (data or {}).get("runs", {})
    if "full" not in runs or "specprefill" not in runs:
        return [line(46, speed, "not measured", None), line(46, exact, "not measured", None)]
    full = {r["turn"]: r for r in runs["full"]["turns"]}
    sparse = {r["turn"]: r for r in runs["specprefill"]["turns"]}
    long = [t for t in sorted(full) if t in sparse and full[t]["new_tokens"] >= threshold]
    ratios = {t: full[t]["ttft_s"] / sparse[t]["ttft_s"] for t in long}
    missed = [t for t in long if full[t]["answered"] and not sparse[t]["answered"]]
    shown = "; ".join(
        f"turn {t} ({full[t]['new_tokens']} new): {ratios[t]:.2f}x, answered {sparse[t]['answered']} "
        f"(full {full[t]['answered']})"
        for t in long
    )
    holds = bool(long) and all(r >= 1.4 for r in ratios.values()) and len(missed) <= 1
    out = [line(46, speed, shown or f"no turn with >= {threshold} new tokens", holds if long else None)]
    checks, notes = [], []
    for method in ("specprefill", "composition"):
        if method not in runs:
            continue
        turns = sorted(runs[method]["turns"], key=lambda r: r["turn"])
        reused = all(b["cached_tokens"] >= a["prompt_tokens"] for a, b in zip(turns, turns[1:]))
        follow = runs[method]["follow_up"]
        same = follow["reply"] == runs["full"]["follow_up"]["reply"]
        same = same and follow["cached_tokens"] >= turns[-1]["prompt_tokens"]
        checks.append(reused and same)
        notes.append(f"{method}: previous conversation reused {reused}, follow-up equal to full's {same}")
    out.append(line(46, exact, "; ".join(notes) or "not measured", all(checks) if checks else None))
    return out


def bench_row(data: dict | None, method: str, tokens: int) -> dict | None:
    rows = [r for r in (data or {}).get("rows", []) if r["method"] == method and r["prompt_tokens"] == tokens]
    return rows[0] if rows and rows[0].get("ttft_s") else None


def ruler_scores(data: dict | None, tokens: int, tasks: list[str]) -> dict[str, dict[str, dict[int, float]]]:
    """{setting: {task: {sample index: score}}} of a RULER run's records at `tokens`."""
    out: dict[str, dict[str, dict[int, float]]] = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in (data or {}).get("records", []):
        if r["tokens"] == tokens and r["task"] in tasks:
            out[r["setting"]][r["task"]][r["index"]] = float(r["score"])
    return out


def long_lines(bench: dict | None, ruler: dict | None, args: argparse.Namespace) -> list[dict]:
    """Issue 47's lines 1 and 2: auto at 16K (speed and RULER answers) and the long-prompt path at 32K."""
    short, longest = (int(n) for n in args.long_lengths.split(",")[:2])
    tasks = args.ruler_tasks.split(",")
    text1 = (
        f"auto at {size(short)}: >= 3x full TTFT, and on the {size(args.ruler_length)} RULER set (>= "
        f"{args.trials} samples per task) within one sample of full on each of {', '.join(tasks)}"
    )
    auto = bench_row(bench, "auto", short)
    if auto is None:
        speed, speed_note = None, "auto not timed"
    else:
        speed = auto["ttft_speedup_vs_full"] >= 3.0
        speed_note = f"auto ran {auto.get('ran')}: {auto['ttft_speedup_vs_full']:.2f}x full ({auto['ttft_s']:.1f} s)"
    scores = ruler_scores(ruler, args.ruler_length, tasks)
    per_task, answers, complete = [], [], True
    for task in tasks:
        full, comp = scores.get("full", {}).get(task, {}), scores.get(AUTO_NAME, {}).get(task, {})
        both = sorted(set(full) & set(comp))
        lost = sum(full[i] for i in both) - sum(comp[i] for i in both)
        complete = complete and len(both) >= args.trials  # a run still under way (it resumes) decides nothing
        answers.append(lost <= 1.0)
        per_task.append(
            f"{task} {sum(comp[i] for i in both):g} vs {sum(full[i] for i in both):g} of {len(both)} samples"
        )
    ran_composition = auto is not None and auto.get("ran") == "specprefill+h2o"
    holds = None if speed is None or not complete else bool(speed and all(answers) and ran_composition)
    note = f"{speed_note}; RULER (auto's composition vs full, scores summed): {'; '.join(per_task)}"
    if auto is not None and not ran_composition:
        note += " (auto did not run the composition here: the RULER candidate is not what auto ran)"
    out = [line(47, text1, note, holds)]
    at_32k = bench_row(bench, "auto", longest)
    text2 = f"at {size(longest)}: the default long-prompt path (auto) >= 4x full TTFT (one timed run each)"
    if at_32k is None:
        out.append(line(47, text2, "not timed", None))
    else:
        ratio = at_32k["ttft_speedup_vs_full"]
        shown = f"auto ran {at_32k.get('ran')}: {ratio:.2f}x full ({at_32k['ttft_s']:.1f} s)"
        out.append(line(47, text2, shown, ratio >= 4.0))
    return out


def roofline_line(data: dict | None) -> dict:
    text = (
        "roofline at 128K on H100 for the new defaults (auto's composition) >= 6x full, Llama-3.1-8B + 1B and "
        "the Qwen pair"
    )
    rows = [a for a in (data or {}).get("acceptance", []) if a.get("setting") == "auto's composition"]
    pairs = [a for a in rows if a["pair"].startswith(("Llama-3.1-8B", "Qwen2.5-Coder"))]
    if not pairs:
        return line(47, text, "not computed (research/roofline/roofline.py)", None, session=False)
    shown = "; ".join(f"{a['pair']}: {a['speedup']:.1f}x at {a['keep']:.0%} kept" for a in pairs)
    return line(47, text, shown, all(a["meets_6x"] for a in pairs), session=False)


def frontier_line(data: dict | None) -> dict:
    text = "no default loses more than 5 points of the mean on the 4K frontier set"
    if data is None:
        return line(47, text, "not measured", None, session=False)
    by: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in data["records"]:
        by[r["setting"]][r["task"]].append(float(r["score"]))

    def mean(setting: str) -> float:
        tasks = by[setting]
        return 100 * sum(sum(v) / len(v) for v in tasks.values()) / len(tasks)

    full = mean("full")
    gaps = {name: mean(name) - full for name in DEFAULTS_4K if name in by}
    shown = "; ".join(f"{name}: {gap:+.1f}" for name, gap in gaps.items())
    from specfill.core.config import AUTO_COMPOSITION_FROM

    return line(
        47,
        text,
        f"{shown} against full's {full:.1f} (the decoded 4K run, bf16; auto weighs the composition only from "
        f"{AUTO_COMPOSITION_FROM:,} tokens)",
        bool(gaps) and all(g >= -5.0 for g in gaps.values()),
        session=False,
    )


def speed_rows(args: argparse.Namespace) -> list[dict]:
    """Every timed bench row of this session (bench_long, bench_8k, bench_rest), its speed-up against
    full at the same length from whichever file timed full there; auto's rows named by what it ran."""
    rows = []
    for name in ("bench_long", "bench_8k", "bench_rest"):
        rows += [r for r in (load(args.out / f"{name}.json") or {}).get("rows", []) if r.get("ttft_s")]
    full = {r["prompt_tokens"]: r["ttft_s"] for r in rows if r["method"] == "full"}
    out = []
    for r in sorted(rows, key=lambda r: (r["prompt_tokens"], SPEED_METHODS.index(r["method"]))):
        label = f"auto ({r.get('ran')})" if r["method"] == "auto" else r["method"]
        base = full.get(r["prompt_tokens"])
        out.append({**r, "label": label, "speedup": base / r["ttft_s"] if base else None})
    return out


def speed_lines(rows: list[dict], ruler: dict | None, args: argparse.Namespace) -> list[str]:
    """Issue 47 item 5's table: TTFT per method and length with peak memory, RULER's 16K scores beside
    full's and auto's rows (the mean score over the tasks, in points)."""
    if not rows:
        return []
    scores = ruler_scores(ruler, args.ruler_length, args.ruler_tasks.split(","))

    def points(setting: str) -> str:
        tasks = [t for t in scores.get(setting, {}).values() if t]
        return f"{100 * sum(sum(t.values()) / len(t) for t in tasks) / len(tasks):.1f}" if tasks else "-"

    lines = [
        "",
        "## Speed (one timed run each) and answers",
        "",
        f"RULER: mean score over {', '.join(args.ruler_tasks.split(','))} at {size(args.ruler_length)} "
        "(ruler_16k.md), beside the rows it decodes.",
        "",
        "| method | prompt tokens | TTFT (s) | speed-up vs full | kept | peak GB | RULER |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        near = abs(r["prompt_tokens"] - args.ruler_length) <= 0.05 * args.ruler_length
        setting = {"full": "full", "auto": AUTO_NAME}.get(r["method"]) if near else None
        if setting == AUTO_NAME and r.get("ran") != "specprefill+h2o":
            setting = None
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        peak = f"{r['peak_memory_gb']:.2f}" if r.get("peak_memory_gb") else "-"
        lines.append(
            f"| {r['label']} | {r['prompt_tokens']} | {r['ttft_s']:.4g} | {speedup} | {r['kept_tokens']} | {peak} "
            f"| {points(setting) if setting else '-'} |"
        )
    return lines


def summary(args: argparse.Namespace) -> int:
    """acceptance.{md,json}: each line, what was measured, whether it holds (None: not measured);
    the speed table of every bench row and bench_ttft.png."""
    info = load(args.out / "machine.json") or {}
    counts = info.get("dtype") == "bfloat16" and not info.get("forced") and "bf16" in str(info.get("cpu_features"))
    lines = turns_lines(load(args.out / "agent_turns.json"), args.turn_threshold)
    bench = load(args.out / "bench_long.json")
    lines += long_lines(bench, load(args.out / "ruler_16k.json"), args)
    lines += [roofline_line(load(ROOFLINE)), frontier_line(load(FRONTIER_4K))]
    for x in lines:
        if x["session"] and not counts and x["holds"] is not None:
            x["holds"] = None
            x["measured"] += " (not bf16 on a CPU with bf16 units: does not count)"
    machine_text = f"{info.get('cpu', '?')} [{info.get('cpu_features', '?')}], {info.get('dtype', '?')}"
    machine_text += f", {args.threads} threads"
    load_before = ", ".join(f"{x:.2f}" for x in info.get("load_average", []))
    md = [
        "# Issues 46 and 47: the acceptance lines, as measured",
        "",
        f"Machine: {machine_text}; load before {load_before}. Models: {Path(args.model).name} "
        f"+ {Path(args.speculator).name}. Files: agent_turns.*, bench_long.*, ruler_16k.* beside this one.",
        "",
        "| issue | acceptance line | measured | holds |",
        "|---|---|---|---|",
    ]
    mark = {True: "yes", False: "no", None: "-"}
    md += [f"| #{x['issue']} | {x['line']} | {x['measured']} | {mark[x['holds']]} |" for x in lines]
    rows = speed_rows(args)
    md += speed_lines(rows, load(args.out / "ruler_16k.json"), args)
    if rows:
        from specfill.evaluation.plots import plot_ttft

        title = f"{Path(args.model).name} + {Path(args.speculator).name}: {machine_text}, cpu"
        plot_ttft([{**r, "method": r["label"]} for r in rows], args.out / "bench_ttft.png", title)
    write(args.out / "acceptance.md", "\n".join(md) + "\n")
    write(args.out / "acceptance.json", json.dumps({"machine": info, "lines": lines}, indent=1) + "\n")
    return 0
