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

SpecPrefill TTFT here is composed: the speculator pass (timed once per sample, shared by the
settings, all of one look-ahead) plus the setting's own selection, sparse prefill and first
token; the API's TTFT times the same parts in one call.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from specfill.api import encode_prompt, stream_generate
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.decoding import decode_tokens
from specfill.core.methods.specprefill import run_speculator, speculative_prefill
from specfill.core.runtime import PrefillInfo, PrefillMethod, SamplingConfig
from specfill.settings import prompt_ids

from .quality import position_map
from .ruler_report import DROPPED_BELOW
from .ruler_run import span_shares
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
    info = PrefillInfo(record_memory=method.name == "h2o")
    text, ttft = "", 0.0
    for response in stream_generate(model, tokenizer, sample.prompt, budget, method=method, prefill_info=info):
        text += response.text
        ttft = ttft or response.ttft
        if score(text, sample.outputs, sample.metric) == 1.0:
            break
    row = position_map(info, info.prompt_tokens)
    return _record(sample, label, text, score(text, sample.outputs, sample.metric), ttft, row, info.kept_tokens)


def run_specprefill(model, speculator, tokenizer, sample: RulerSample, settings: dict[str, SpecPrefillConfig],
                    budget: int, done: Callable[[dict], None]) -> None:
    """Every SpecPrefill setting (all of one look-ahead) on one speculator pass over the sample."""
    lookaheads = {c.lookahead for c in settings.values()}
    if len(lookaheads) != 1:
        raise ValueError(f"settings compared on one speculator pass need one look-ahead, got {sorted(lookaheads)}")
    ops, stop = model.ops, frozenset(tokenizer.eos_token_ids)
    ids = np.asarray(prompt_ids(encode_prompt(tokenizer, sample.prompt), model.args.vocab_size), np.int64)
    spec_model, spec_step = model.speculator_model(speculator)
    with ops.device_scope():
        started = time.perf_counter()
        spec = run_speculator(ops, spec_model, ids, lookahead=lookaheads.pop(), stop_ids=stop, step_size=spec_step)
        ops.settle([spec.queries, spec.keys])
        speculated = time.perf_counter() - started
        for label, config in settings.items():
            started = time.perf_counter()
            sparse = speculative_prefill(ops, model.model, ids, spec_model, config, stop_ids=stop, extra_slots=budget,
                                         step_size=model.prefill_step_size, speculator_step_size=spec_step,
                                         speculated=spec)
            tokens = decode_tokens(ops, model.model, sparse.logits, next_position=len(ids), max_tokens=budget,
                                   sampling=SamplingConfig(), stop_ids=stop, cache=sparse.cache, history=ids)
            text, value, ttft = _answer(tokenizer, tokens, sample, started)
            row = np.zeros(len(ids))
            row[sparse.selection.kept] = 1.0
            record = _record(sample, label, text, value, speculated + ttft, row.tolist(), len(sparse.selection.kept))
            done({**record, "speculator_s": speculated})


def classify(records: list[dict]) -> None:
    """Adds "full_score" and "cause" to every sparse record whose sample has a full-prefill
    record: None when it scored at least full's, else "selection" or "misread" (module doc)."""
    full = {(r["task"], r["index"]): r["score"] for r in records if r["setting"] == "full"}
    for r in records:
        base = full.get((r["task"], r["index"]))
        r["full_score"] = base
        if r["setting"] == "full" or base is None or r["score"] >= base:
            r["cause"] = None
        elif r.get("answer_kept"):
            r["cause"] = "selection" if min(r["answer_kept"]) < DROPPED_BELOW else "misread"
        else:
            r["cause"] = "misread"


def resolve_budget(sample: RulerSample, answer_tokens: int | None) -> int:
    """RULER's answer budget for the task, capped by answer_tokens."""
    return sample.max_tokens if answer_tokens is None else min(answer_tokens, sample.max_tokens)


def default_settings() -> dict[str, Setting]:
    """The candidates issue 24 lists, each against the current defaults."""
    base = SpecPrefillConfig()
    return {"keep 0.1": base,
            "keep 0.1 max-la": replace(base, lookahead_reduction="max"),
            "keep 0.1 nb1": replace(base, neighbours=1),
            "mass 0.5 [0.05,0.3]": SpecPrefillConfig(keep_mass=0.5, mass_floor=0.05, mass_ceiling=0.3),
            "mass 0.5 max-la": SpecPrefillConfig(keep_mass=0.5, mass_floor=0.05, mass_ceiling=0.3,
                                                 lookahead_reduction="max")}
