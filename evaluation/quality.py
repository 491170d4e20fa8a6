"""Quality of the sparse prefills: perplexity on a fixed text and passkey retrieval."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np

from specfill.api import Session, prefill_method
from specfill.api import open as open_session
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, PrefillMethod

from .machine import describe_machine
from .positions import position_map
from .ruler_run import add_ruler_deltas, run_ruler
from .ruler_tasks import RULER_TASKS
from .texts import multikey_prompt_spans, multikey_trials, passkey_prompt_spans, passkey_trials, tokens_of_length

RETRIEVAL_TASKS = ("passkey", "multikey")  # each a list of rows in the result, one per (method, length)


@dataclass(frozen=True)
class EvalPlan:
    backend: str = "cuda"
    model: str | None = None
    tasks: tuple[str, ...] = ("perplexity", "passkey")
    methods: tuple[str, ...] = ("full", "h2o", "specprefill")
    perplexity_lengths: tuple[int, ...] = (4000, 8000)
    passkey_lengths: tuple[int, ...] = (2000, 4000, 8000)
    trials: int = 20
    keeps: tuple[float, ...] = (0.1, 0.3)
    dense_tails: tuple[int, ...] = (H2OConfig.dense_tail,)  # one H2O variant per W
    score_layers: tuple[str, ...] = (SpecPrefillConfig.layers,)  # one SpecPrefill variant per rule (x keeps)
    speculator: str = "self:8"
    h2o: H2OConfig = field(default_factory=H2OConfig)
    specprefill: SpecPrefillConfig = field(default_factory=SpecPrefillConfig)
    dtype: str | None = None
    device: str | None = None
    ruler_lengths: tuple[int, ...] = (4000,)  # prompt lengths of RULER's tasks (names in `tasks`)
    ruler_seed: int = 0
    ruler_first: int = 0  # index of the first RULER sample (a later run can add samples to an earlier one's)
    chat_template: bool = True  # RULER prompts in the model's chat template, when it has one
    answer_tokens: int | None = None  # cap on RULER's answer budgets (None: RULER's)


def method_variants(plan: EvalPlan, speculator) -> dict[str, PrefillMethod]:
    """Label -> method: H2O once per dense tail W, speculative prefill once per (scoring-layer
    rule, keep ratio). A setting is named in the label when it is swept or not the default."""
    out = {}
    for name in plan.methods:
        if name == "specprefill":
            for rule in plan.score_layers:
                named = len(plan.score_layers) > 1 or rule != SpecPrefillConfig.layers
                for keep in plan.keeps:
                    config = replace(plan.specprefill.with_keep(ratio=keep), layers=rule)
                    label = f"specprefill keep={keep:g}" + (f" layers={rule}" if named else "")
                    out[label] = prefill_method(name, specprefill=config, speculator=speculator)
        elif name == "h2o":
            for tail in plan.dense_tails:
                named = len(plan.dense_tails) > 1 or tail != H2OConfig.dense_tail
                config = H2OConfig(**{**vars(plan.h2o), "dense_tail": tail})
                out["h2o" + (f" W={tail}" if named else "")] = prefill_method(name, h2o=config)
        else:
            out[name] = prefill_method(name)
    return out


def perplexity(model, ids: list[int], method: PrefillMethod) -> tuple[float, float]:
    """(exp(mean negative log-likelihood of ids[1:]) with the prompt's attention from `method`,
    the prefill's wall time in seconds)."""
    info = GenerationInfo()
    logits = np.asarray(model.prompt_logits(ids, method=method, info=info), dtype=np.float64)[:-1]
    peak = logits.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(logits - peak).sum(axis=-1)) + peak[:, 0]
    nll = log_norm - logits[np.arange(len(ids) - 1), ids[1:]]
    return float(math.exp(nll.mean())), info.seconds["prefill"]


def retrieval_prompts(tokenizer, task: str, n_tokens: int, n_trials: int) -> list[tuple[str, dict, str, float]]:
    """Per trial (prompt, token spans [start, end) of the asked needle and the question, the answer,
    the asked needle's depth): passkey (one key in repeated filler) or multikey (four named numbers
    in the evaluation text, one asked). Seeded by the length: every method sees the same prompts."""
    if task == "passkey":
        return [
            (*passkey_prompt_spans(tokenizer, n_tokens, depth, key), str(key), depth)
            for depth, key in passkey_trials(n_trials, seed=n_tokens)
        ]
    return [
        (*multikey_prompt_spans(tokenizer, n_tokens, trial), trial["depths"][trial["asked"]])
        for trial in multikey_trials(n_trials, seed=n_tokens)
    ]


def retrieval_trial(
    session: Session, prompt: str | list[int], answer: str, method: PrefillMethod, info: GenerationInfo
) -> tuple[bool, float]:
    """(the greedy answer, 12 tokens at most, holds `answer` once spaces are dropped, TTFT in s)."""
    responses = list(session.stream(prompt, max_tokens=12, method=method, prefill_info=info))
    text = "".join(r.text for r in responses)
    return answer in text.replace(" ", ""), responses[0].ttft


def eval_steps(plan: EvalPlan, methods: dict[str, PrefillMethod]) -> int:
    """How many units of work run_eval reports to `step`: a perplexity cell or a passkey trial."""
    dense = sum(m.name != "specprefill" for m in methods.values())
    return (
        dense * len(plan.perplexity_lengths) * ("perplexity" in plan.tasks)
        + len(methods) * len(plan.passkey_lengths) * plan.trials * sum(t in plan.tasks for t in RETRIEVAL_TASKS)
        + len(methods) * len(plan.ruler_lengths) * plan.trials * sum(t in plan.tasks for t in RULER_TASKS)
    )


def run_eval(
    plan: EvalPlan,
    log: Callable[[str], None] = print,
    step: Callable[[int, str], None] | None = None,
    cell_done: Callable[[dict], None] | None = None,
) -> dict:
    """step(total, label) after each unit of work (see eval_steps), for a progress bar;
    cell_done(result so far, "complete" False) after each finished cell, to save partial results."""
    session = open_session(
        plan.model,
        backend=plan.backend,
        dtype=plan.dtype,
        device=plan.device,
        speculator=plan.speculator if "specprefill" in plan.methods else None,
        notify=log,
    )
    model, tokenizer = session.model, session.tokenizer
    methods = method_variants(plan, session.speculator)
    total = eval_steps(plan, methods)

    def done(label: str) -> None:
        if step is not None:
            step(total, label)

    def finished_cell() -> None:
        if cell_done is not None:
            add_deltas(result)
            cell_done(result)

    machine = describe_machine({"model_dtype": str(model.dtype), "device_name": model.device_name})
    result: dict = {
        "plan": _plan_dict(plan, methods),
        "machine": machine,
        "complete": False,
        "perplexity": [],
        "maps": {},
        "map_marks": {},
        "ruler": [],
        "ruler_samples": [],
        "ruler_maps": {},
        "ruler_marks": {},
        **{task: [] for task in RETRIEVAL_TASKS},
    }
    if "perplexity" in plan.tasks:
        for length in plan.perplexity_lengths:
            ids = tokens_of_length(tokenizer, length)
            for label, method in methods.items():
                if method.name == "specprefill":
                    continue  # it drops tokens: no per-position likelihood
                ppl, seconds = perplexity(model, ids, method)
                result["perplexity"].append(
                    {"method": label, "tokens": length, "perplexity": ppl, "prefill_s": seconds}
                )
                done(f"perplexity {label} {length}")
                log(f"perplexity {label:<22} {length:>6} tokens: {ppl:.4f}")
                finished_cell()
    for task in (t for t in RETRIEVAL_TASKS if t in plan.tasks):
        for length in plan.passkey_lengths:
            prompts = retrieval_prompts(tokenizer, task, length, plan.trials)
            for label, method in methods.items():
                result[task].append(_retrieval_cell(session, task, prompts, label, method, length, result, done))
                log(f"{task} {label:<22} {length:>6} tokens: {result[task][-1]['hits']}/{plan.trials}")
                finished_cell()
    run_ruler(plan, session, methods, result, done, log, finished_cell)
    add_deltas(result)
    result["machine"]["load_average_1min_at_end"] = describe_machine().get("load_average_1min")
    result["complete"] = True
    return result


def _retrieval_cell(
    session: Session,
    task: str,
    prompts: list,
    label: str,
    method: PrefillMethod,
    length: int,
    result: dict,
    done: Callable[[str], None],
) -> dict:
    """Every trial of one retrieval task for one method at one length; the position map of the
    trial whose asked needle lies nearest mid-depth (with its needle / question spans) goes into
    result["maps"] / result["map_marks"] (passkey's under "LABEL @ N", others' "TASK LABEL @ N")."""
    hits, actual, ttfts = 0, [], []
    mid_depth = min(range(len(prompts)), key=lambda i: abs(prompts[i][3] - 0.5))  # the mapped trial
    for index, (prompt, spans, answer, _) in enumerate(prompts):
        info = GenerationInfo(record_memory=method.name == "h2o")
        ok, ttft = retrieval_trial(session, prompt, answer, method, info)
        hits += ok
        ttfts.append(ttft)
        done(f"{task} {label} {length}")
        actual.append(info.prompt_tokens)
        maps = position_map(info, info.prompt_tokens) if index == mid_depth else None
        if maps is not None:
            key = ("" if task == "passkey" else f"{task} ") + f"{label} @ {length}"
            result["maps"][key], result["map_marks"][key] = maps, spans
    return {
        "method": label,
        "tokens": length,
        "trials": len(prompts),
        "hits": hits,
        "mean_prompt_tokens": float(np.mean(actual)),
        "accuracy": hits / len(prompts),
        "median_ttft_s": float(np.median(ttfts)),
    }


def add_deltas(result: dict) -> None:
    """Against full prefill at the same length: perplexity change (%), passkey accuracy change
    (points) and speed-up (full's prefill / median TTFT over the method's)."""
    full = {r["tokens"]: r for r in result["perplexity"] if r["method"] == "full"}
    for r in result["perplexity"]:
        base = full.get(r["tokens"])
        r["vs_full_pct"] = 100.0 * (r["perplexity"] / base["perplexity"] - 1.0) if base else None
        r["speedup_vs_full"] = base["prefill_s"] / r["prefill_s"] if base and r.get("prefill_s") else None
    for task in RETRIEVAL_TASKS:
        full_acc = {r["tokens"]: r for r in result.get(task, []) if r["method"] == "full"}
        for r in result.get(task, []):
            base = full_acc.get(r["tokens"])
            r["vs_full_points"] = 100.0 * (r["accuracy"] - base["accuracy"]) if base else None
            r["speedup_vs_full"] = (
                base["median_ttft_s"] / r["median_ttft_s"] if base and r.get("median_ttft_s") else None
            )
    add_ruler_deltas(result)


def is_default(method: PrefillMethod) -> bool:
    """The method runs at the library's default settings (marked in the trade-off plot)."""
    if method.name == "h2o":
        return method.h2o == H2OConfig()
    if method.name == "specprefill":
        return method.specprefill == SpecPrefillConfig()
    return True


def _plan_dict(plan: EvalPlan, methods: dict[str, PrefillMethod]) -> dict:
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(plan).items()}
    out["h2o"], out["specprefill"] = asdict(plan.h2o), asdict(plan.specprefill)
    out["model"] = plan.model or "demo (SmolLM2-135M-Instruct Q4_1)"
    out["defaults"] = [label for label, method in methods.items() if is_default(method)]
    return out
