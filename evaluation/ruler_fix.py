"""Why a sparse prefill loses a RULER sample, and which setting keeps it (issue 24, items 2-3).

Per sample: full prefill once (the reference answer and TTFT), the speculator's pass over the
prompt ONCE, then every SpecPrefill scoring/selection setting on that same pass (selection, the
main model's sparse prefill of the kept tokens, greedy decoding), and H2O settings through the
API. Each record holds the answer, its RULER score, TTFT, what was kept of every answer span
(chain hop, needle, QA answer sentence) and, when it scored below full prefill, the cause:

- "selection": some answer span kept less than DROPPED_BELOW of its tokens (SpecPrefill), or
  less than that share of H2O's last (layer, KV head) memory sets hold it: the method dropped it;
- "misread": every answer span was kept, the answer is still wrong (RoPE gaps, fragmented
  context; H2O: the KV of earlier chunks computed with sparse attention).

SpecPrefill TTFT here is composed: the speculator pass (timed once per sample and saved, shared
by the settings, all of one look-ahead) plus the setting's own selection, sparse prefill and
first token; the API's TTFT times the same parts in one call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from specfill.api import encode_prompt
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.decoding import decode_tokens
from specfill.core.methods.specprefill import prefill_kept, run_speculator
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig, check_token_ids

from .quality import position_map
from .ruler_report import DROPPED_BELOW
from .ruler_run import run_sample, span_shares
from .ruler_tasks import RulerSample, score

Setting = SpecPrefillConfig | H2OConfig


def parse_setting(text: str) -> tuple[str, Setting]:
    """"NAME:key=value,..." -> (NAME, config). NAME starting with "h2o" builds an H2OConfig,
    else a SpecPrefillConfig; values are ints, floats or words ("max"); "NAME:" is the default."""
    name, _, body = text.partition(":")
    fields: dict[str, Any] = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        for cast in (int, float, str):
            try:
                fields[key.strip()] = cast(value.strip())
                break
            except ValueError:
                continue
    kind = H2OConfig if name.startswith("h2o") else SpecPrefillConfig
    return name, kind(**fields)


def _answer(tokenizer, tokens, sample: RulerSample, started: float) -> tuple[str, float, float]:
    """Detokenize greedy tokens until the score is final or they end: (text, score, TTFT)."""
    detok, text, ttft = tokenizer.streaming_detokenizer(), "", 0.0
    for token in tokens:
        ttft = ttft or time.perf_counter() - started
        if token in tokenizer.eos_token_ids:
            break
        text += detok.add_token(token)
        if score(text, sample.outputs, sample.metric) == 1.0:
            break
    text += detok.finish()
    return text, score(text, sample.outputs, sample.metric), ttft


def compact_map(row: list[float] | None) -> dict | None:
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


def _record(sample: RulerSample, label: str, text: str, value: float, ttft: float, row: list[float] | None,
            kept: int) -> dict:
    return {"task": sample.task, "index": sample.index, "setting": label, "prompt_tokens": sample.tokens,
            "score": value, "prediction": text.strip()[:200], "expected": list(sample.outputs), "ttft_s": ttft,
            "kept_tokens": kept, "answer_kept": span_shares(row, sample.spans.get("needle", [])),
            "question_kept": span_shares(row, sample.spans["question"]), "map": compact_map(row),
            "spans": sample.spans}


def run_api(model, tokenizer, sample: RulerSample, label: str, method: PrefillMethod, budget: int) -> dict:
    """Full or H2O prefill through the public API (H2O records its memory sets for the map)."""
    info = GenerationInfo(record_memory=method.name == "h2o")
    text, value, ttft = run_sample(model, tokenizer, sample, method, budget, info)
    return _record(sample, label, text, value, ttft, position_map(info, info.prompt_tokens), info.kept_tokens)


@dataclass
class SavedPass:
    """A speculator pass over one sample's prompt, on the host: queries [n_l, 1 + N', Hq, D] and
    prompt keys [n_l, Hkv, P, D] (float32), the prompt ids [P], its wall time, the scale and the
    speculator's sliding windows. Saved to .npz so that scoring settings run in later processes
    (one 10-minute run cannot hold a 4K speculator pass and several sparse prefills under load)."""

    queries: np.ndarray
    keys: np.ndarray
    ids: np.ndarray
    seconds: float
    scale: float
    windows: tuple

    def save(self, path: Path) -> None:
        windows = np.array([-1 if w is None else w for w in self.windows], np.int64)
        np.savez(path, queries=self.queries, keys=self.keys, ids=self.ids, seconds=self.seconds, scale=self.scale,
                 windows=windows)

    @classmethod
    def load(cls, path: Path) -> "SavedPass":
        with np.load(path) as f:
            windows = tuple(None if w < 0 else int(w) for w in f["windows"])
            return cls(f["queries"], f["keys"], f["ids"], float(f["seconds"]), float(f["scale"]), windows)


def speculate(model, speculator, tokenizer, sample: RulerSample, lookahead: int) -> SavedPass:
    """The speculator's pass over the sample's prompt (core/methods/specprefill.run_speculator)."""
    ops = model.ops
    ids = np.asarray(check_token_ids(encode_prompt(tokenizer, sample.prompt), model.args.vocab_size), np.int64)
    spec_model, spec_step = model.speculator_model(speculator)
    with ops.device_scope():
        started = time.perf_counter()
        spec = run_speculator(ops, spec_model, ids, lookahead=lookahead, stop_ids=frozenset(tokenizer.eos_token_ids),
                              step_size=spec_step)
        queries, keys = ops.to_numpy(spec.queries), ops.to_numpy(spec.keys)
        seconds = time.perf_counter() - started
    return SavedPass(queries.astype(np.float32), keys.astype(np.float32), ids, seconds,
                     spec_model.args.attention_scale, tuple(spec_model.args.layer_windows))


def run_setting(model, tokenizer, sample: RulerSample, saved: SavedPass, label: str, config: SpecPrefillConfig,
                budget: int, decode: bool) -> dict:
    """One SpecPrefill setting on a saved pass: the NumPy reference's scoring and selection (the
    backends match it: conformance), then (decode) the main model's sparse prefill of the kept
    tokens and greedy decoding. TTFT = the pass's time + selection, sparse prefill, first token.
    Without decode: what was kept only (score and TTFT None)."""
    if config.lookahead + 1 < saved.queries.shape[1]:
        raise ValueError(f"{label}: look-ahead {config.lookahead} is shorter than the saved pass's")
    started = time.perf_counter()
    _, selection = speculative_selection(saved.queries.astype(np.float64), saved.keys.astype(np.float64), config,
                                         saved.scale, REFERENCE, saved.windows if any(saved.windows) else ())
    row = np.zeros(len(saved.ids))
    row[selection.kept] = 1.0
    text, value, ttft = "", None, None
    if decode:
        ops, stop = model.ops, frozenset(tokenizer.eos_token_ids)
        with ops.device_scope():
            logits, cache = prefill_kept(ops, model.model, saved.ids, selection, extra_slots=budget,
                                         step_size=model.prefill_step_size)
            tokens = decode_tokens(ops, model.model, logits, next_position=len(saved.ids), max_tokens=budget,
                                   sampling=SamplingConfig(), stop_ids=stop, cache=cache, history=saved.ids)
            text, value, first = _answer(tokenizer, tokens, sample, started)
            ttft = saved.seconds + first
    return {**_record(sample, label, text, value, ttft, row.tolist(), len(selection.kept)),
            "speculator_s": saved.seconds}


def classify(records: list[dict]) -> None:
    """Adds "full_score" and "cause" to every sparse record whose sample has a full-prefill
    record: None when it scored at least full's, else "selection" or "misread" (module doc)."""
    full = {(r["task"], r["index"]): r["score"] for r in records if r["setting"] == "full"}
    for r in records:
        base = full.get((r["task"], r["index"]))
        r["full_score"] = base
        if r["setting"] == "full" or base is None or r["score"] is None or r["score"] >= base:
            r["cause"] = None
        elif r.get("answer_kept"):
            r["cause"] = "selection" if min(r["answer_kept"]) < DROPPED_BELOW else "misread"
        else:
            r["cause"] = "misread"


def default_settings() -> dict[str, Setting]:
    """The candidates issue 24 lists, each against the current defaults."""
    base = SpecPrefillConfig()
    return {"keep 0.1": base,
            "keep 0.1 max-la": replace(base, lookahead_reduction="max"),
            "keep 0.1 nb1": replace(base, neighbours=1),
            "mass 0.5 [0.05,0.3]": SpecPrefillConfig(keep_mass=0.5, mass_floor=0.05, mass_ceiling=0.3),
            "mass 0.5 [0.05,0.3] max-la": SpecPrefillConfig(keep_mass=0.5, mass_floor=0.05, mass_ceiling=0.3,
                                                 lookahead_reduction="max")}


def selection_grid() -> dict[str, Setting]:
    """A wider grid for selection-only comparisons (cheap: no main model): keep ratios as the
    budget baseline, then each candidate and their combinations."""
    grid: dict[str, Setting] = {f"keep {r}": SpecPrefillConfig(keep_ratio=r) for r in (0.1, 0.2, 0.3)}
    grid.update({f"keep {r} max-la": SpecPrefillConfig(keep_ratio=r, lookahead_reduction="max") for r in (0.1, 0.2)})
    grid.update({f"keep 0.1 nb{n}": SpecPrefillConfig(neighbours=n) for n in (1, 2)})
    for p in (0.3, 0.5, 0.7):
        for how in ("mean", "max"):
            grid[f"mass {p} [0.05,0.3]{' max-la' if how == 'max' else ''}"] = SpecPrefillConfig(
                keep_mass=p, mass_floor=0.05, mass_ceiling=0.3, lookahead_reduction=how)
    # the existing reduction options: mean over layers (L-mean) and over heads too (HL-mean)
    grid.update({f"keep {r} L-mean": SpecPrefillConfig(keep_ratio=r, layer_reduction="mean") for r in (0.1, 0.15, 0.2)})
    grid["keep 0.1 HL-mean"] = SpecPrefillConfig(head_reduction="mean", layer_reduction="mean")
    grid["keep 0.1 L-mean nb1"] = SpecPrefillConfig(layer_reduction="mean", neighbours=1)
    grid["keep 0.1 L-mean max-la"] = SpecPrefillConfig(layer_reduction="mean", lookahead_reduction="max")
    for p in (0.5, 0.7):
        grid[f"mass {p} [0.05,0.3] L-mean"] = SpecPrefillConfig(keep_mass=p, mass_floor=0.05, mass_ceiling=0.3,
                                                                layer_reduction="mean")
    return grid
