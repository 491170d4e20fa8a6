"""What the selection protocol's records say (evaluation/ruler_protocol.py): per task, length and
candidate the RULER score, TTFT and speed-up vs full prefill, how much of the answer's spans each
candidate kept (selection recall, known even where no answer was decoded), why each loss
happened; the frontier over the tasks (mean score and recall against speed-up or kept share) and
the plots (per task; the frontier; the positions map of every candidate on one sample)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specfill.core.runtime import COMPOSED

from .machine import timing_machine
from .plots import _pyplot, _save, plot_position_map
from .ruler_protocol import classify, expand_map, write_atomic
from .ruler_report import DROPPED_BELOW


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def timed_on(record: dict, runs: list[dict]) -> frozenset:
    """The machines a record's TTFT was taken on (machine.timing_machine): its own (`timed_on`; else,
    for a record from before records said, the run going at its `measured` time, or the machine of
    every run where the result's runs all had one) and, on a saved pass, the pass's (`pass_timed_on`;
    where the pass did not say, the runs' one machine as reports read it before, else None: unknown)."""
    machines = {timing_machine(r["machine"]) for r in runs}
    only = next(iter(machines)) if len(machines) == 1 else None
    own = record.get("timed_on")
    if own is None:
        started = [r for r in runs if record.get("measured") and r["started"] <= record["measured"]]
        own = timing_machine(started[-1]["machine"]) if started else only
    if "speculator_s" not in record or record.get("end_to_end"):  # its TTFT taken in one call
        return frozenset({own})
    return frozenset({own, record.get("pass_timed_on") or only})


def _one_machine(machines: set) -> str | None:
    """The one known machine of a set of timing machines, else None (several, or one unknown)."""
    return next(iter(machines)) if len(machines) == 1 and None not in machines else None


def summarize(records: list[dict], runs: list[dict] | None = None) -> list[dict]:
    """One row per (length, task, setting): samples (decoded), mean score (0-100), mean kept share
    of the prompt, span recall (mean over samples and answer spans of the share kept), answer
    recall (mean over samples of the least-kept span's share), samples with every answer span
    kept, median TTFT and the speed-up (full's median TTFT over the setting's, same samples), given
    only where both were timed on one machine (`runs`: the result's, timed_on); else `timed_apart`
    names the machines."""
    classify(records)
    machines = {} if runs is None else {id(r): timed_on(r, runs) for r in records if r["ttft_s"] is not None}
    rows = []
    for tokens, task in dict.fromkeys((r.get("tokens"), r["task"]) for r in records):
        cell = [r for r in records if r["task"] == task and r.get("tokens") == tokens]
        fulls = [r for r in cell if r.get("kind", r["setting"]) == "full" and r["ttft_s"] is not None]
        full = _median([r["ttft_s"] for r in fulls])
        for setting in dict.fromkeys(r["setting"] for r in cell):
            mine = [r for r in cell if r["setting"] == setting]
            scored = [r for r in mine if r["score"] is not None]
            is_full = mine[0].get("kind", setting) == "full"
            least = [min(r["answer_kept"]) for r in mine if r.get("answer_kept") and not is_full]
            spans = [float(np.mean(r["answer_kept"])) for r in mine if r.get("answer_kept") and not is_full]
            ttft = _median([r["ttft_s"] for r in scored])
            timed = [r for r in scored if r["ttft_s"] is not None]
            apart = None
            if full and ttft and not is_full and runs is not None:
                mine_on, full_on = (set().union(*(machines[id(r)] for r in rs)) for rs in (timed, fulls))
                one = _one_machine(mine_on)
                if one is None or one != _one_machine(full_on):
                    apart = sorted(str(m) for m in mine_on | full_on)
            same = [r["full_score"] for r in scored if r.get("full_score") is not None]  # full on these samples
            rows.append(
                {
                    "tokens": tokens,
                    "task": task,
                    "setting": setting,
                    "kind": mine[0].get("kind"),
                    "full_same_samples": 100.0 * float(np.mean(same)) if same and not is_full else None,
                    "samples": len(mine),
                    "decoded": len(scored),
                    "score": 100.0 * float(np.mean([r["score"] for r in scored])) if scored else None,
                    "kept_share": float(np.mean([r["kept_tokens"] / r["prompt_tokens"] for r in mine])),
                    "span_recall": float(np.mean(spans)) if spans else None,
                    "answer_recall": float(np.mean(least)) if least else None,
                    "all_spans_kept": sum(s >= DROPPED_BELOW for s in least) if least else None,
                    "median_ttft_s": ttft,
                    "speedup": full / ttft if full and ttft and not is_full and apart is None else None,
                    "timed_apart": apart,
                    "causes": {c: sum(r.get("cause") == c for r in scored) for c in ("selection", "misread")},
                }
            )
    return rows


def frontier(rows: list[dict]) -> list[dict]:
    """One row per (length, setting) over the tasks it ran: mean score, the mean and worst task's
    points against full prefill on the same samples, mean span recall and samples with every span kept, mean
    kept share, and the
    geometric-mean speed-up."""
    out = []
    for tokens, setting in dict.fromkeys((r["tokens"], r["setting"]) for r in rows):
        mine = [r for r in rows if r["tokens"] == tokens and r["setting"] == setting]
        scored = [r for r in mine if r["score"] is not None]
        gaps = [r["score"] - r["full_same_samples"] for r in scored if r.get("full_same_samples") is not None]
        if mine[0].get("kind") == "full":
            gaps = [0.0 for _ in scored]
        recall = [r["span_recall"] for r in mine if r["span_recall"] is not None]
        speed = [r["speedup"] for r in mine if r["speedup"]]
        out.append(
            {
                "tokens": tokens,
                "setting": setting,
                "tasks": len(mine),
                "kind": mine[0].get("kind"),
                "samples": sum(r["samples"] for r in mine),
                "decoded": sum(r["decoded"] for r in mine),
                "score": float(np.mean([r["score"] for r in scored])) if scored else None,
                "vs_full_mean": float(np.mean(gaps)) if gaps else None,
                "vs_full_worst": float(min(gaps)) if gaps else None,
                "span_recall": float(np.mean(recall)) if recall else None,
                "all_spans_kept": sum(r["all_spans_kept"] or 0 for r in mine) if recall else None,
                "kept_share": float(np.mean([r["kept_share"] for r in mine])),
                "speedup": float(np.exp(np.mean(np.log(speed)))) if speed else None,
            }
        )
    return out


def _f(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def markdown(rows: list[dict], records: list[dict], header: list[str]) -> list[str]:
    """The tables: per task and setting, then every loss against full prefill with its cause."""
    lines = header + [
        "",
        "| length | task | setting | samples (decoded) | score | kept share | span recall | least-kept span | "
        "samples with every answer span kept | median TTFT (s) | speed-up vs full | losses: selection / misread |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        causes = r["causes"]
        lines.append(
            f"| {r['tokens']} | {r['task']} | {r['setting']} | {r['samples']} ({r['decoded']}) "
            f"| {_f(r['score'], '{:.0f}')} "
            f"| {r['kept_share']:.3f} | {_f(r['span_recall'], '{:.2f}')} | {_f(r['answer_recall'], '{:.2f}')} "
            f"| {_f(r['all_spans_kept'], '{}')}/{r['samples']} | {_f(r['median_ttft_s'], '{:.0f}')} "
            f"| {_f(r['speedup'], '{:.2f}x')} | {causes['selection']} / {causes['misread']} |"
        )
    apart = [r for r in rows if r.get("timed_apart")]
    if apart:
        machines = sorted({m for r in apart for m in r["timed_apart"]})
        groups = dict.fromkeys((r["setting"], r["tokens"]) for r in apart)
        cells = ", ".join(
            f"{s} at {t} ({sum(r['setting'] == s and r['tokens'] == t for r in apart)} task(s))" for s, t in groups
        )
        lines += [
            "",
            f"No speed-up for {cells}: full's times and the setting's were not all taken on one machine "
            "(None: a record or saved pass from before they named theirs): " + "; ".join(machines) + ".",
        ]
    losses = [r for r in records if r.get("cause")]
    lines += [
        "",
        f"Losses against full prefill (selection: an answer span kept < {DROPPED_BELOW:.0%}; "
        "misread: every span kept, answer still wrong):",
        "",
    ]
    if not losses:
        return lines + ["None among the samples with a full-prefill record."]
    lines += [
        "| length | task | sample | setting | score / full | cause | answer spans kept | answer (start) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in losses:
        shares = ", ".join(f"{s:.2f}" for s in r.get("answer_kept") or []) or "-"
        answer = r["prediction"][:50].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r.get('tokens')} | {r['task']} | {r['index']} | {r['setting']} "
            f"| {r['score']:.2f} / {r['full_score']:.2f} "
            f"| {r['cause']} | {shares} | {answer} |"
        )
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
                ax["bottom"].scatter(
                    r["kept_share"],
                    r["answer_recall"],
                    color=color,
                    marker=marker,
                    s=45,
                    edgecolors="black",
                    linewidths=0.5,
                )
        full = next((r for r in rows if r["task"] == task and r["setting"] == "full" and r["score"] is not None), None)
        if decoded:
            if full:
                ax["top"].axhline(full["score"], color="grey", linestyle="--", linewidth=0.8, label="full prefill")
            ax["top"].set(
                title=f"{task}: score vs {'speed-up' if timed else 'kept share (no full record)'}",
                xlabel="TTFT speed-up vs full (x)" if timed else "kept share of the prompt",
                ylabel="RULER score",
                ylim=(-5, 105),
            )
        ax["bottom"].set(
            title=f"{task}: what selection kept",
            xlabel="kept share of the prompt",
            ylabel="answer recall (least-kept span)",
            ylim=(-0.05, 1.05),
        )
        for one in ax.values():
            one.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], color=c, marker=m, linestyle="", markeredgecolor="black", label=s)
        for s, (c, m) in style.items()
    ]
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


def frontier_markdown(front: list[dict]) -> list[str]:
    lines = [
        "| length | setting | tasks | samples (decoded) | mean score | vs full: mean / worst task (points) | "
        "span recall | samples with every span kept | kept share | speed-up (geo-mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in front:
        gap = "-" if r["vs_full_mean"] is None else f"{r['vs_full_mean']:+.1f} / {r['vs_full_worst']:+.1f}"
        lines.append(
            f"| {r['tokens']} | {r['setting']} | {r['tasks']} | {r['samples']} ({r['decoded']}) "
            f"| {_f(r['score'], '{:.1f}')} | {gap} | {_f(r['span_recall'], '{:.3f}')} "
            f"| {_f(r['all_spans_kept'], '{}')}/{r['samples']} | {r['kept_share']:.3f} "
            f"| {_f(r['speedup'], '{:.2f}x')} |"
        )
    return lines


def plot_frontier(front: list[dict], path: Path, title: str) -> Path:
    """Per length: mean score over the tasks against the TTFT speed-up (decoded), or span recall
    against the kept share (selection only); one labelled point per setting that ran every task
    of that length, full prefill's score dashed."""
    plt = _pyplot()
    lengths = list(dict.fromkeys(r["tokens"] for r in front))
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.4 * len(lengths), 5.2), squeeze=False)
    for ax, tokens in zip(axes[0], lengths):
        most = max(r["tasks"] for r in front if r["tokens"] == tokens)
        mine = [
            r for r in front if r["tokens"] == tokens and r["tasks"] == most
        ]  # a mean over fewer tasks is not comparable
        decoded = any(r["score"] is not None and r["speedup"] for r in mine)
        for r in mine:
            if decoded:
                if r["kind"] == "full" and r["score"] is not None:
                    ax.axhline(r["score"], color="grey", linestyle="--", linewidth=0.8)
                    ax.scatter(1.0, r["score"], color="black", marker="s", s=40)
                    ax.annotate("full", (1.0, r["score"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
                    continue
                x, y = r["speedup"], r["score"]
            else:
                x, y = r["kept_share"], r["span_recall"]
            if x is None or y is None:
                continue
            color = {"specprefill": "tab:blue", COMPOSED: "tab:green"}.get(r["kind"], "tab:orange")
            ax.scatter(x, y, color=color, s=40, edgecolors="black", linewidths=0.5)
            ax.annotate(r["setting"], (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set(
            title=f"~{tokens} tokens, {mine[0]['tasks']} tasks",
            xlabel="TTFT speed-up vs full prefill (x)" if decoded else "kept share of the prompt",
            ylabel="mean RULER score over the tasks" if decoded else "answer-span recall (mean over tasks)",
        )
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return _save(fig, path)


def protocol_title(result: dict) -> str:
    plan, machine = result["plan"], result["runs"][-1]["machine"]
    return (
        f"{plan['model']} (speculator {plan['speculator']}), {plan['dtype']}, {plan['backend']} on {plan['device']}, "
        f"{machine.get('torch_threads', '?')} thread(s), {machine['cpu'][:24]} [{machine.get('cpu_features', '?')}]"
    )


def write_protocol_report(result: dict, out: Path, name: str, map_sample: int | None = None) -> list[Path]:
    """<name>.md (frontier, per-task table, losses, runs), <name>_frontier.png, one
    <name>_tradeoff_<length>.png per length and <name>_positions_<task>_<length>.png."""
    from .machine import machine_line

    records = result["records"]
    rows = summarize(records, result["runs"])
    front = frontier(rows)
    title = protocol_title(result)
    runs = [
        f"- run {r['started']}{' (selection only)' if r.get('selection_only') else ''}: {machine_line(r['machine'])}; "
        f"load at end {r.get('load_average_1min_at_end', '-')}"
        for r in result["runs"]
    ]
    header = [
        f"# RULER selection protocol: {name}",
        "",
        title,
        "",
        "SpecPrefill TTFT = the speculator pass (timed when it was saved) + the setting's sparse prefill and first "
        "token (its selection, the NumPy reference's, is timed apart: reference_selection_s; until 2026-12-04 it was "
        "counted, and the first candidate of each sample paid for the scores every candidate shares), unless the "
        "run was end to end (through the API); full and H2O through the API. "
        "Full prefill's answers come from the answer cache when a run computed them before.",
        "",
        "## Frontier (over the tasks)",
        "",
        *frontier_markdown(front),
        "",
        "## Per task",
    ]
    paths = [out / f"{name}.md"]
    tail = ["", "## Runs (machine, load average)", "", *runs]
    write_atomic(paths[0], "\n".join(markdown(rows, records, header) + tail) + "\n")
    paths.append(plot_frontier(front, out / f"{name}_frontier.png", title))
    for tokens in dict.fromkeys(r["tokens"] for r in rows):
        paths.append(
            plot_fix(
                [r for r in rows if r["tokens"] == tokens],
                out / f"{name}_tradeoff_{tokens}.png",
                f"~{tokens} tokens; {title}",
            )
        )
        for task in dict.fromkeys(r["task"] for r in rows if r["tokens"] == tokens):
            mine = [r for r in records if r.get("tokens") == tokens]
            index = map_sample if map_sample is not None else _first_loss(mine, task)
            if any(r["task"] == task and r["index"] == index and r.get("map") for r in mine):
                paths.append(
                    plot_positions(
                        mine,
                        task,
                        index,
                        out / f"{name}_positions_{task}_{tokens}.png",
                        f"{task} #{index} ~{tokens}: kept (SpecPrefill) / in last memory sets (H2O); {title}",
                    )
                )
    return paths


def _first_loss(records: list[dict], task: str) -> int:
    lost = [r["index"] for r in records if r["task"] == task and r.get("cause")]
    return lost[0] if lost else min(r["index"] for r in records if r["task"] == task)
