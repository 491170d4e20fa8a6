"""`specfill eval` on RULER's tasks: every method on the same samples per (task, length), scored
as RULER scores them, with what each sparse method kept of the answer's spans.

Generation stops once the sample's score can no longer change (every expected string found, or
one for QA) or at RULER's answer budget (or --answer-tokens when smaller): stopping there gives
the score the whole budget would."""

from __future__ import annotations

from typing import Callable

import numpy as np

from specfill.api import Session
from specfill.core.runtime import GenerationInfo, PrefillMethod

from .positions import position_map
from .ruler_tasks import RulerSample, build_sample, score


def answer_budget(sample: RulerSample, answer_tokens: int | None) -> int:
    """RULER's answer budget for the task, capped by answer_tokens."""
    return sample.max_tokens if answer_tokens is None else min(answer_tokens, sample.max_tokens)


def run_sample(
    session: Session, sample: RulerSample, method: PrefillMethod, answer_tokens: int | None, info: GenerationInfo
) -> tuple[str, float, float]:
    """(the greedy answer after RULER's answer prefix, its score in [0, 1], TTFT in s)."""
    budget = answer_budget(sample, answer_tokens)
    text, ttft = "", 0.0
    for response in session.stream(sample.prompt, max_tokens=budget, method=method, prefill_info=info):
        text += response.text
        ttft = ttft or response.ttft
        if score(text, sample.outputs, sample.metric) == 1.0:
            break
    return text, score(text, sample.outputs, sample.metric), ttft


def span_shares(row: list[float] | None, spans: list[list[int]]) -> list[float] | None:
    """Per span [start, end): the mean of the position map over it (SpecPrefill: the share of its
    tokens kept; H2O: the share of (layer, KV head) last memory sets holding its tokens)."""
    if row is None:
        return None
    values = np.asarray(row)
    return [round(float(values[a:b].mean()), 3) if b > a else 0.0 for a, b in spans]


def ruler_cell(
    session: Session,
    samples: list[RulerSample],
    label: str,
    method: PrefillMethod,
    answer_tokens: int | None,
    done: Callable[[str], None],
) -> tuple[dict, list[dict], list]:
    """One method over one (task, length)'s samples: (the table row, per-sample records, the
    per-sample position maps (None for full prefill))."""
    records, maps = [], []
    for sample in samples:
        info = GenerationInfo(record_memory=method.name == "h2o")
        text, value, ttft = run_sample(session, sample, method, answer_tokens, info)
        row = position_map(info, info.prompt_tokens)
        maps.append(row)
        records.append(
            {
                "task": sample.task,
                "method": label,
                "index": sample.index,
                "prompt_tokens": sample.tokens,
                "score": value,
                "prediction": text.strip()[:200],
                "expected": list(sample.outputs),
                "ttft_s": ttft,
                "kept_tokens": info.kept_tokens,
                "needle_kept": span_shares(row, sample.spans.get("needle", [])),
                "question_kept": span_shares(row, sample.spans["question"]),
            }
        )
        done(f"{sample.task} {label}")
    return summary_row(records), records, maps


def summary_row(records: list[dict]) -> dict:
    """The table row of one (task, method[, length]) from its per-sample records."""
    return {
        "task": records[0]["task"],
        "method": records[0]["method"],
        "samples": len(records),
        "score": 100.0 * float(np.mean([r["score"] for r in records])),
        "mean_prompt_tokens": float(np.mean([r["prompt_tokens"] for r in records])),
        "median_ttft_s": float(np.median([r["ttft_s"] for r in records])),
    }


def run_ruler(
    plan,
    session: Session,
    methods: dict[str, PrefillMethod],
    result: dict,
    done: Callable[[str], None],
    log: Callable[[str], None],
    finished_cell: Callable[[], None],
) -> None:
    """Every RULER task of plan.tasks at every plan.ruler_lengths for every method, plan.trials
    samples each (indices from plan.ruler_first), into result["ruler"] (rows), result["ruler_samples"]
    (per-sample records) and
    result["ruler_maps"] / ["ruler_marks"] (per task, method and length, the map of the first
    sample the method lost against full prefill, else of sample 0, with its spans)."""
    from .ruler_tasks import RULER_TASKS

    for task in (t for t in plan.tasks if t in RULER_TASKS):
        for length in plan.ruler_lengths:
            samples = [
                build_sample(session.tokenizer, task, length, i, plan.ruler_seed, plan.chat_template)
                for i in range(plan.ruler_first, plan.ruler_first + plan.trials)
            ]
            full_scores: list[float] | None = None
            for label, method in methods.items():
                row, records, maps = ruler_cell(session, samples, label, method, plan.answer_tokens, done)
                row["tokens"] = length
                result["ruler"].append(row)
                for record in records:
                    record["tokens"] = length
                result["ruler_samples"] += records
                if method.name == "full":
                    full_scores = [r["score"] for r in records]
                _keep_map(result, f"{task} {label} @ {length}", samples, records, maps, full_scores)
                log(f"{task} {label:<22} {length:>6} tokens: score {row['score']:.0f} ({len(samples)} samples)")
                finished_cell()


def _keep_map(
    result: dict, key: str, samples: list[RulerSample], records: list[dict], maps: list, full_scores: list[float] | None
) -> None:
    if maps[0] is None:
        return
    lost = [i for i, r in enumerate(records) if full_scores is not None and r["score"] < full_scores[i]]
    pick = lost[0] if lost else 0
    result["ruler_maps"][f"{key} #{pick}"] = maps[pick]
    result["ruler_marks"][f"{key} #{pick}"] = samples[pick].spans


def add_ruler_deltas(result: dict) -> None:
    """Per row: score change vs full prefill (points) and TTFT speed-up (full's median TTFT over
    the method's), at the same task and length."""
    full = {(r["task"], r["tokens"]): r for r in result.get("ruler", []) if r["method"] == "full"}
    for r in result.get("ruler", []):
        base = full.get((r["task"], r["tokens"]))
        r["vs_full_points"] = r["score"] - base["score"] if base else None
        r["speedup_vs_full"] = base["median_ttft_s"] / r["median_ttft_s"] if base and r["median_ttft_s"] else None
