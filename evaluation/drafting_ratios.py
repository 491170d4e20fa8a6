"""End-to-end time of drafting against plain decoding, as a user meets it (issue #38 item 5).

Every row is one (dtype, prompt kind, reply length) with the default drafting (a draft model, the
adaptive schedule, `num_draft_tokens` 3), run `runs` times: each run times a plain greedy generation
and a drafted one of the same prompt, whole (`stream_generate` read to its end: TTFT, the draft
model's prompt prefill and the decode). The first run may calibrate (the draft's cost book,
core/methods/draft_costs.py, is written by it); the last run is the one judged. The draft's books
are this machine's own, as for any user: the table reports what was in them when it ran.

speedup = plain seconds / drafted seconds (above 1: drafting is faster). Results go to <name>.json
and <name>.md, both rewritten whole (a partial file, then one rename) after every row, so an
interrupted run keeps what it measured.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specfill.api import Session
from specfill.api import open as open_session
from specfill.prompts import read_prompt_file

from .machine import describe_machine, machine_line

DEFAULT_PROMPTS = (("code", "results/drafting/code_prompt.txt"), ("prose", "results/drafting/prose_prompt.txt"))


@dataclass(frozen=True)
class RatioPlan:
    """model / draft: paths (None: the demo model); prompts: (kind, text file) pairs, each cut to
    its first prompt_tokens tokens; reply_tokens: max_tokens per row; runs: per row, at least 2."""

    backend: str = "cuda"
    model: str | None = None
    draft: str = "self:8"
    prompts: tuple[tuple[str, str], ...] = DEFAULT_PROMPTS
    prompt_tokens: int = 1000
    reply_tokens: tuple[int, ...] = (32, 256)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    runs: int = 2
    device: str | None = None


def _timed(session: Session, ids: list[int], max_tokens: int, **drafting) -> dict:
    started = time.perf_counter()
    steps = list(session.stream(ids, max_tokens=max_tokens, **drafting))
    seconds = time.perf_counter() - started
    last = steps[-1]
    return {
        "seconds": seconds,
        "ttft_s": last.ttft,
        "generated": last.generation_tokens,
        "drafted": last.drafted_tokens,
        "accepted": last.accepted_tokens,
        "skipped": last.draft_skipped,
        "tokens": [r.token for r in steps],
    }


def run_drafting_ratios(
    plan: RatioPlan, log: Callable[[str], None] = print, row_done: Callable[[dict], object] | None = None
) -> dict:
    """The table's rows (see the module docstring); row_done(result so far) after each row."""
    result = {
        "plan": {**vars(plan), "prompts": [list(p) for p in plan.prompts], "reply_tokens": list(plan.reply_tokens)},
        "machine": describe_machine(),
        "device": None,
        "rows": [],
    }
    result["plan"]["dtypes"] = list(plan.dtypes)
    result["plan"]["model"] = plan.model or "demo (SmolLM2-135M-Instruct Q4_1)"
    texts = {kind: read_prompt_file(path, "--ratio-prompts file") for kind, path in plan.prompts}  # before any load
    for dtype in plan.dtypes:
        session = open_session(plan.model, backend=plan.backend, dtype=dtype, device=plan.device, notify=log)
        draft = session.load_speculator(plan.draft, "draft model")  # not the session's: the plain runs draft none
        result["device"] = session.model.device_name
        for kind, text in texts.items():
            ids = session.tokenizer.encode(text)[: plan.prompt_tokens]
            list(session.stream(ids[:64], max_tokens=4))  # warm-up of the main model's kernels
            for reply in plan.reply_tokens:
                for run in range(1, plan.runs + 1):
                    plain = _timed(session, ids, reply)
                    drafted = _timed(session, ids, reply, draft_model=draft)
                    row = {
                        "dtype": dtype,
                        "prompt": kind,
                        "prompt_tokens": len(ids),
                        "reply_tokens": reply,
                        "run": run,
                        "judged": run == plan.runs,
                        "plain_s": plain["seconds"],
                        "drafted_s": drafted["seconds"],
                        "speedup": plain["seconds"] / drafted["seconds"],
                        "generated": drafted["generated"],
                        "drafted": drafted["drafted"],
                        "accepted": drafted["accepted"],
                        "skipped": drafted["skipped"],
                        "identical": plain["tokens"] == drafted["tokens"],
                    }
                    result["rows"].append(row)
                    log(
                        f"{dtype} {kind} {reply} tokens, run {run}: plain {row['plain_s']:.2f} s, drafted "
                        f"{row['drafted_s']:.2f} s ({row['speedup']:.2f}x), accepted {row['accepted']}/"
                        f"{row['drafted']}{', skipped' if row['skipped'] else ''}"
                    )
                    if row_done is not None:
                        row_done(result)
    return result


def ratios_markdown(result: dict) -> str:
    plan, rows = result["plan"], result["rows"]
    judged = [r["speedup"] for r in rows if r["judged"]]
    lines = [
        "# Drafting against plain decoding, end to end",
        "",
        f"Machine: {machine_line(result['machine'])}; device {result['device']}.",
        f"Model: {plan['model']}; draft model: {plan['draft']}; default drafting (adaptive schedule, k <= 3), "
        f"greedy; prompts cut to {plan['prompt_tokens']} tokens; each row run {plan['runs']} times, the last "
        "judged (the first may calibrate the draft's cost book). speedup = plain s / drafted s.",
        "",
        f"Judged rows: {len(judged)}; least speedup {min(judged):.2f}x." if judged else "No judged row yet.",
        "",
        "| dtype | prompt | reply tokens | run | plain (s) | drafted (s) | speedup | generated | accepted / drafted "
        "| drafting skipped | same text |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        run = f"**{r['run']}**" if r["judged"] else str(r["run"])
        lines.append(
            f"| {r['dtype']} | {r['prompt']} | {r['reply_tokens']} | {run} | {r['plain_s']:.2f} | "
            f"{r['drafted_s']:.2f} | {r['speedup']:.2f}x | {r['generated']} | {r['accepted']}/{r['drafted']} | "
            f"{'yes' if r['skipped'] else 'no'} | {r['identical']} |"
        )
    return "\n".join(lines) + "\n"


def write_drafting_ratios(result: dict, out_dir: str | os.PathLike, name: str = "drafting_ratios") -> list[Path]:
    """<name>.json and <name>.md in out_dir, each written whole or not at all."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    for path, text in ((paths[0], json.dumps(result, indent=1) + "\n"), (paths[1], ratios_markdown(result))):
        partial = path.with_name(path.name + f".{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    return paths
