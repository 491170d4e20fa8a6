"""The selection protocol of `specfill eval --candidates` (RULER tasks): which prefill setting
keeps the answer, measured cheaply enough for a small machine.

Per sample:
- the speculator's pass over the prompt (queries of the last prompt token and of the look-ahead
  tokens, prompt keys of every layer) runs ONCE and is saved under the cache directory, keyed by
  (speculator, backend, dtype, task, length, seed, index, template);
- every SpecPrefill candidate is scored on that pass with the NumPy reference's scoring and
  selection (`PassScores`: attention, pooling and the head reduction once per sample, the rest per
  candidate) without the main model: what it keeps of each answer span (chain hop, answer
  sentence, queried needle) is the selection proxy (`--selection-only` stops there); SpecPrefill
  over an H2O speculator is scored on the sample's H2O pass, saved per speculator H2O setting
  (ruler_passes.pass_path), so its candidates share one pass as the dense ones do;
- the main model decodes only the candidates asked for: SpecPrefill from the saved pass (TTFT =
  the pass's measured time + selection, the kept tokens' prefill and the first token) or, with
  end_to_end, through the API like any user (TTFT measured in one call); SpecPrefill over an H2O
  speculator, H2O and full through the API. Full prefill's answer is cached per (model, backend,
  dtype, device, sample, answer budget): no run computes it twice.
Records are written one by one (atomically) and a run resumes past every (task, length, sample,
candidate) already recorded. A loss against full prefill gets a cause: "selection" (an answer
span kept below DROPPED_BELOW: SpecPrefill dropped it; H2O: too few last memory sets hold it) or
"misread" (every span kept, the answer still wrong).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specfill.api import Session, choose_device
from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig
from specfill.core.io.demo_model import cache_dir as specfill_cache
from specfill.core.runtime import COMPOSED, GenerationInfo, PrefillMethod
from specfill.core.text_units import with_text_units_config

from .machine import timing_machine
from .positions import position_map
from .ruler_candidates import (  # noqa: F401 (parse_candidate, default_candidates, candidate_grid, resolve_candidates: re-exported)
    Setting,
    candidate_grid,
    default_candidates,
    method_name,
    on_saved_pass,
    parse_candidate,
    resolve_candidates,
    selected_alone,
)
from .ruler_passes import PassScores, SavedPass, decode_from_pass, pass_path, prefill_name, speculate
from .ruler_report import DROPPED_BELOW
from .ruler_run import span_shares
from .ruler_tasks import RulerSample, build_sample


@dataclass(frozen=True)
class ProtocolPlan:
    model: str
    speculator: str
    backend: str
    dtype: str
    device: str | None
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]
    candidates: dict[str, Setting]
    trials: int = 8
    first: int = 0
    seed: int = 0
    chat_template: bool = True
    answer_tokens: int | None = None
    selection_only: bool = False
    end_to_end: bool = False  # SpecPrefill candidates decoded through the API (one speculator pass each)
    cache_dir: Path = field(default_factory=lambda: specfill_cache() / "eval")

    def __post_init__(self) -> None:
        # a nested speculator (deep_keep) selects on its own pass, never on a saved one: refused, not skipped
        nested = [n for n, c in self.candidates.items() if isinstance(c, SpecPrefillConfig) and not selected_alone(c)]
        if self.selection_only and nested:
            raise ConfigError(
                f"--selection-only cannot score {', '.join(map(repr, nested))}: a nested speculator (deep_keep) "
                "selects on its own pass; decode it (no --selection-only) or use "
                "research/keep_length/composition_keeps.py"
            )


def _stem(path: str) -> str:
    return Path(str(path)).name.removesuffix(".gguf")


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def sample_key(sample: RulerSample, length: int, seed: int, chat: bool) -> str:
    return f"{sample.task}_{length}_{seed}_{sample.index}_{'chat' if chat else 'plain'}"


def compact_map(row) -> dict | None:
    """A position map for JSON: kept/dropped as [start, end) runs, fractions (H2O) to 2 decimals."""
    if row is None:
        return None
    values = np.asarray(row, np.float64)
    if np.isin(values, (0.0, 1.0)).all():
        edges = np.flatnonzero(np.diff(np.r_[0.0, values, 0.0]))
        return {"n": len(values), "runs": edges.reshape(-1, 2).tolist()}
    return {"n": len(values), "values": np.round(values, 2).tolist()}


def expand_map(stored: dict) -> np.ndarray:
    """compact_map's inverse: [n] float."""
    if "values" in stored:
        return np.asarray(stored["values"], np.float64)
    row = np.zeros(stored["n"])
    for start, end in stored["runs"]:
        row[start:end] = 1.0
    return row


def record(
    sample: RulerSample,
    length: int,
    setting: str,
    kind: str,
    *,
    text: str | None,
    value: float | None,
    ttft: float | None,
    row,
    kept: int,
    **extra,
) -> dict:
    """One (sample, candidate) result. answer_kept: per answer span, the share kept (None: full)."""
    return {
        "task": sample.task,
        "tokens": length,
        "index": sample.index,
        "setting": setting,
        "kind": kind,
        "prompt_tokens": sample.tokens,
        "score": value,
        "prediction": None if text is None else text.strip()[:200],
        "expected": list(sample.outputs),
        "ttft_s": ttft,
        "kept_tokens": kept,
        "answer_kept": span_shares(row, sample.spans.get("needle", [])),
        "question_kept": span_shares(row, sample.spans["question"]),
        "map": compact_map(row),
        "spans": sample.spans,
        **extra,
    }


NO_ANSWER: dict = {"text": None, "value": None, "ttft": None}  # record's answer where nothing is decoded


def run_api(session: Session, sample: RulerSample, method: PrefillMethod, budget: int) -> dict:
    """Through the public API like any user: record's keywords (the answer text, its score, TTFT,
    the position map and the kept tokens)."""
    from .ruler_run import run_sample

    info = GenerationInfo(record_memory=method.name == "h2o")
    text, value, ttft = run_sample(session, sample, method, budget, info)
    return {
        "text": text,
        "value": value,
        "ttft": ttft,
        "row": position_map(info, info.prompt_tokens),
        "kept": info.kept_tokens,
    }


class Models:
    """The tokenizer at once; the main model's Session (its speculator loaded beside it) on first use.
    A selection-only run never decodes: its speculator passes load the speculator alone (`scorer`),
    not the main model beside it (the 1.5B in float32 took 1.3 min and ~6 GB per sitting for nothing)."""

    def __init__(self, plan: ProtocolPlan, log: Callable[[str], None]):
        from specfill.core.io.tokenizer import load_tokenizer

        self.plan, self.log = plan, log
        self._session: Session | None = None
        self._speculator: Session | None = None
        gguf = str(plan.model).endswith(".gguf")
        self.tokenizer = load_tokenizer(plan.model) if gguf else self.session().tokenizer

    def session(self) -> Session:
        if self._session is None:
            from specfill.api import open as open_session

            p = self.plan
            self.log(f"loading {p.model} and {p.speculator} ({p.backend}, {p.dtype})")
            self._session = open_session(
                p.model, backend=p.backend, dtype=p.dtype, device=p.device, speculator=p.speculator, notify=self.log
            )
        return self._session

    def scorer(self) -> tuple[Any, Any]:
        """(model, speculator) for a speculator pass: the main Session's pair, or in a selection-only
        run the speculator as both (the pass reads the main model's ops, vocabulary size and companion
        check only: the speculator is on the same backend, dtype and device, and loaded alone)."""
        alone = self.plan.selection_only and not str(self.plan.speculator).startswith("self:")
        if not alone or self._session is not None:  # "self:K" is the main model's first K layers
            session = self.session()
            return session.model, session.speculator
        if self._speculator is None:
            from specfill.api import open as open_session

            p = self.plan
            self.log(f"loading {p.speculator} alone ({p.backend}, {p.dtype}): selection only, no main model")
            self._speculator = open_session(
                p.speculator, backend=p.backend, dtype=p.dtype, device=p.device, notify=self.log
            )
        return self._speculator.model, self._speculator.model


def _key(r: dict) -> tuple:
    return r["task"], r["tokens"], r["index"], r["setting"]


def run_protocol(
    plan: ProtocolPlan, out: Path, log: Callable[[str], None], step: Callable[[str], None], machine: dict
) -> dict:
    """Every candidate on every (length, task, sample) of the plan, into the JSON file `out`
    (written after each record; records already there are kept and not run again)."""
    from .ruler_run import answer_budget

    result = json.loads(out.read_text()) if out.exists() else {"records": [], "runs": []}
    result["plan"] = plan_summary(plan)
    run = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "selection_only": plan.selection_only,
        "end_to_end": plan.end_to_end,
    }
    result["runs"].append(run)
    done = {_key(r) for r in result["records"] if r["score"] is not None or plan.selection_only}
    models = Models(plan, log)
    # the device the models run on (a CUDA backend without a GPU: cpu, as --device cpu says), so that
    # the two spellings share their saved passes and answers
    on, _ = choose_device(plan.backend, plan.device)
    device = f"{plan.backend}-{plan.dtype}-{on or 'default'}"
    passes = plan.cache_dir / "passes" / f"{_stem(plan.speculator).replace(':', '-')}-{device}"
    answers = plan.cache_dir / "answers" / f"{_stem(plan.model)}-{device}"

    written: list[tuple] = []
    here = timing_machine(machine)  # every time this run takes is taken here (a cached answer keeps its own)

    def keep(rec: dict) -> None:
        written.append(_key(rec))
        result["records"] = [r for r in result["records"] if _key(r) != _key(rec)] + [rec]
        done.add(_key(rec))
        run["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
        write_atomic(out, json.dumps(result) + "\n")
        shown = "-" if rec["score"] is None else f"{rec['score']:.2f}"
        ttft = "-" if rec["ttft_s"] is None else f"{rec['ttft_s']:.1f}s"
        step(
            f"{rec['task']}@{rec['tokens']} #{rec['index']} {rec['setting']}: score {shown} TTFT {ttft} "
            f"kept {rec['kept_tokens']} answer kept {rec['answer_kept']}"
        )

    # the most observation-window queries a candidate scores with: a saved pass holding fewer is rerun
    on_pass = {n: s for n, s in plan.candidates.items() if on_saved_pass(s, plan.selection_only)}
    window = max((s.query_window for s in on_pass.values()), default=1)
    for length in plan.lengths:
        for task in plan.tasks:
            for index in range(plan.first, plan.first + plan.trials):
                todo = [
                    n
                    for n in plan.candidates
                    if (task, length, index, n) not in done
                    and not (plan.selection_only and not selected_alone(plan.candidates[n]))
                ]
                if not todo:
                    continue
                sample = build_sample(models.tokenizer, task, length, index, plan.seed, plan.chat_template)
                budget = answer_budget(sample, plan.answer_tokens)
                name = sample_key(sample, length, plan.seed, plan.chat_template)
                scores: dict[Path, PassScores] = {}  # the sample's passes, one per speculator prefill
                for candidate in todo:
                    on = None
                    if candidate in on_pass:
                        path = pass_path(passes, name, on_pass[candidate])
                        if path not in scores:
                            h2o = on_pass[candidate].speculator_prefill
                            saved = _saved_pass(models, path, sample, log, window, h2o, here)
                            scores[path] = PassScores(saved)
                        on = scores[path]
                    cache = answers / f"{name}_{budget}.json"
                    keep(_run_candidate(plan, models, sample, length, candidate, on, budget, cache, here))
    if not written:  # nothing ran: no run to record
        result["runs"].remove(run)
    text = json.dumps(result) + "\n"
    if not out.exists() or out.read_text() != text:  # the plan (its candidates) may have changed
        write_atomic(out, text)
    return result


def _saved_pass(
    models: Models,
    path: Path,
    sample: RulerSample,
    log: Callable[[str], None],
    window: int = 1,
    h2o: H2OConfig | None = None,
    here: str = "",
) -> SavedPass:
    """The sample's saved pass (dense, or an H2O prompt pass with `h2o`), run (and saved) when there
    is none, it holds fewer than `window` of the prompt's last queries (a pass saved before query
    windows holds one) or it ran another prefill."""
    if path.exists():
        saved = SavedPass.load(path)
        if saved.n_window >= min(window, len(saved.ids)) and saved.prefill == prefill_name(h2o):
            return saved
    saved = speculate(*models.scorer(), models.tokenizer, sample, h2o=h2o, timed_on=here)
    saved.save(path)
    log(f"{sample.task} #{sample.index}: speculator pass ({saved.prefill}) {saved.seconds:.1f} s (saved)")
    return saved


def _run_candidate(
    plan: ProtocolPlan,
    models: Models,
    sample: RulerSample,
    length: int,
    name: str,
    scores: PassScores | None,
    budget: int,
    full_cache: Path,
    here: str,
) -> dict:
    """One candidate's record; `here`, the machine its times are taken on (timed_on: a SpecPrefill
    record on a saved pass also names the pass's, pass_timed_on; a cached full answer keeps its own)."""
    setting = plan.candidates[name]
    if setting is None:
        if full_cache.exists():
            cached = json.loads(full_cache.read_text())
            return {**cached, "setting": name, "tokens": length, "cached": True}
        answer = run_api(models.session(), sample, PrefillMethod("full"), budget)
        measured = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        load = round(os.getloadavg()[0], 2)
        rec = record(sample, length, name, "full", **answer, machine_load=load, measured=measured, timed_on=here)
        write_atomic(full_cache, json.dumps(rec) + "\n")
        return rec
    if isinstance(setting, H2OConfig):
        answer = run_api(models.session(), sample, PrefillMethod("h2o", h2o=setting), budget)
        return record(sample, length, name, "h2o", **answer, timed_on=here)
    if scores is None or (plan.end_to_end and not plan.selection_only):  # its own speculator pass
        return {**_end_to_end(models.session(), sample, length, name, setting, scores, budget), "timed_on": here}
    # the NumPy reference's selection, timed apart and not in the TTFT: the first candidate of a sample computes
    # the scores the others read (at 16K on a 2-core EPYC 38.7 s, 18.0 s since its products run as BLAS matmuls;
    # then 0.0 s), where SpecPrefill itself scores with its backend's ops (bench times that part: `selection`);
    # counted, it made the first candidate's TTFT look ~20-40 s slower than the next's
    # (results/cpu_bf16_long/ruler_16k_growth until 2026-12-04)
    picked = time.perf_counter()
    selection = scores.select(with_text_units_config(setting, models.tokenizer, scores.saved.ids))
    started = time.perf_counter()
    row = np.zeros(len(scores.saved.ids))
    row[selection.kept] = 1.0
    extra = {"speculator_s": scores.saved.seconds, "config": asdict(setting), "timed_on": here}
    extra["reference_selection_s"] = round(started - picked, 3)
    extra["pass_timed_on"] = scores.saved.timed_on or None  # None: a pass saved before passes said
    if setting.speculator_prefill is not None:  # scored on its H2O pass: no main model (selection only)
        return record(sample, length, name, COMPOSED, **NO_ANSWER, row=row, kept=len(selection.kept), **extra)
    answer = NO_ANSWER
    if not plan.selection_only:  # decoded from the saved pass: TTFT = the pass's time + selection + the rest
        session = models.session()
        text, value, ttft = decode_from_pass(
            session.model, session.tokenizer, sample, scores.saved, selection, budget, started
        )
        answer = {"text": text, "value": value, "ttft": ttft}
    return record(sample, length, name, "specprefill", **answer, row=row, kept=len(selection.kept), **extra)


def _end_to_end(session: Session, sample: RulerSample, length: int, name: str, setting, scores, budget: int) -> dict:
    """A SpecPrefill candidate through the API like any user, its speculator pass included (TTFT
    measured in one call): one on a saved pass (--end-to-end) or over an H2O speculator (its own pass)."""
    method = PrefillMethod("specprefill", specprefill=setting, speculator=session.speculator)
    answer = run_api(session, sample, method, budget)
    if not on_saved_pass(setting):
        return record(sample, length, name, method_name(setting), **answer, end_to_end=True, config=asdict(setting))
    extra = {"speculator_s": scores.saved.seconds, "config": asdict(setting)}
    return record(sample, length, name, "specprefill", **answer, end_to_end=True, **extra)


def plan_summary(plan: ProtocolPlan) -> dict:
    return {
        "model": _stem(plan.model),
        "speculator": _stem(plan.speculator),
        "backend": plan.backend,
        "dtype": plan.dtype,
        "device": plan.device or "default",
        "tasks": list(plan.tasks),
        "lengths": list(plan.lengths),
        "seed": plan.seed,
        "chat_template": plan.chat_template,
        "answer_tokens": plan.answer_tokens,
        "candidates": {
            n: None if s is None else {**asdict(s), "method": method_name(s)} for n, s in plan.candidates.items()
        },
    }


def classify(records: list[dict]) -> None:
    """Adds "full_score" and "cause" to every record whose sample has a full-prefill record: None
    when it scored at least full's (or was not decoded), else "selection" or "misread"."""
    full = {
        (r["task"], r.get("tokens"), r["index"]): r["score"] for r in records if r.get("kind", r["setting"]) == "full"
    }
    for r in records:
        base = full.get((r["task"], r.get("tokens"), r["index"]))
        r["full_score"] = base
        if r.get("kind", r["setting"]) == "full" or base is None or r["score"] is None or r["score"] >= base:
            r["cause"] = None
        elif r.get("answer_kept"):
            r["cause"] = "selection" if min(r["answer_kept"]) < DROPPED_BELOW else "misread"
        else:
            r["cause"] = "misread"
