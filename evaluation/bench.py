"""TTFT and decode speed vs prompt length, for chosen methods and backends, in one run."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from specfill.api import Session, prefill_method
from specfill.api import open as open_session
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.config import GROWTH_FROM
from specfill.core.crossover import crossover_from_points, save_calibration
from specfill.core.io.random_model import is_random_model, random_prompt_ids
from specfill.core.probe import auto_choice, auto_crossover, key_for
from specfill.core.runtime import COMPOSED

from .machine import describe_machine, report_head
from .plots import plot_ttft
from .texts import tokens_of_length

BENCH_METHODS = ("full", "h2o", "specprefill", COMPOSED, "auto")  # COMPOSED: SpecPrefill over an H2O speculator
SPECULATING = frozenset({"specprefill", COMPOSED, "auto"})  # the rows a speculator serves (auto: weighs SpecPrefill)


def bench_method(name: str, plan: "BenchPlan", speculator, auto: bool = False):
    """The PrefillMethod a bench row runs (auto: the "auto" method whose calibration it refreshes):
    "specprefill" with the plan's config as given, "specprefill+h2o" with it composed
    (SpecPrefillConfig.composed: the config's speculator_prefill, else H2O in every layer), "auto"
    with the plan's H2O and SpecPrefill settings (what a user's auto request runs: core/probe.py)."""
    if name == "auto":
        return prefill_method("auto", h2o=plan.h2o, specprefill=plan.specprefill, speculator=speculator)
    spec = plan.specprefill.composed() if name == COMPOSED else plan.specprefill
    base = "specprefill" if name == COMPOSED else name
    with_speculator = speculator if base == "specprefill" else None
    if auto:
        return prefill_method("auto", h2o=plan.h2o, specprefill=spec, speculator=with_speculator)
    # each row gets its own method's settings only: the plan's others belong to its other rows (a
    # row handed them would warn, once per row, that they do nothing with its method)
    return prefill_method(
        base,
        h2o=plan.h2o if base == "h2o" else None,
        specprefill=spec if base == "specprefill" else None,
        speculator=with_speculator,
    )


@dataclass(frozen=True)
class BenchPlan:
    backends: tuple[str, ...] = ("cuda",)
    methods: tuple[str, ...] = ("full", "h2o", "specprefill")
    lengths: tuple[int, ...] = (2000, 4000, 8000)
    model: str | None = None
    speculator: str = "self:8"
    h2o: H2OConfig = field(default_factory=H2OConfig)
    specprefill: SpecPrefillConfig = field(default_factory=SpecPrefillConfig)
    decode_tokens: int = 16
    repeats: int = 1
    dtype: str | None = None
    device: str | None = None
    save_crossover: bool = False  # the bench's own crossovers become what `auto` reads on this machine


def _one_run(session: Session, ids, method, decode_tokens) -> dict:
    """One generation; its peak memory is the run's own where the backend can reset the count
    (CUDA: max_memory_allocated; MLX: get_peak_memory; CPU on Linux: the resident set's high-water
    mark, VmHWM: core/ops.process_peak_memory_gb), held weights and caches included."""
    last, scope = None, "run" if session.model.reset_peak_memory() else "process"
    for last in session.stream(ids, max_tokens=decode_tokens, method=method):
        pass
    return {
        "ttft_s": last.ttft,
        "decode_tps": last.generation_tps,
        "kept_tokens": last.kept_tokens,
        "generated": last.generation_tokens,
        "peak_memory_gb": last.peak_memory,
        "peak_memory_scope": scope,  # "process": since the process started (no reset on this system)
        "ran": last.method,  # auto: the method it resolved to
    }


def prompt_ids(plan: BenchPlan, tokenizer, length: int) -> list[int]:
    """The evaluation text's first `length` tokens; seeded random ids for a random-weight model."""
    if is_random_model(plan.model):
        return random_prompt_ids(tokenizer.vocab_size, length, seed=length)
    return tokens_of_length(tokenizer, length)


def run_bench(
    plan: BenchPlan,
    log: Callable[[str], None] = print,
    step: Callable[[int, str], None] | None = None,
    row_done: Callable[[dict], None] | None = None,
    prompts: Callable[[Any, int], list[int]] | None = None,
    calibrate: bool = True,
) -> dict:
    """Every (backend, length, method) after a warm-up; best TTFT of `repeats` runs, the methods of a
    length run in turn, round after round (each row's `ttft_runs_s`: its runs in order).
    step(total, label) after each generation (warm-ups included), for a progress bar;
    row_done(result so far, "complete" False) after each row, to save partial results;
    prompts(tokenizer, length): the prompt ids (default prompt_ids: the evaluation text);
    calibrate False: no crossover or `auto` calibration after the rows (_calibrate)."""
    ids_of = prompts or (lambda tokenizer, length: prompt_ids(plan, tokenizer, length))
    rows: list[dict] = []
    result = {
        "plan": _plan_dict(plan),
        "machine": describe_machine(),
        "complete": False,
        "rows": rows,
        "calibration": [],
    }
    total = len(plan.backends) * len(plan.methods) * (1 + len(plan.lengths) * plan.repeats)

    def done(label: str) -> None:
        if step is not None:
            step(total, label)

    for backend in plan.backends:
        speculates = bool(SPECULATING & set(plan.methods))
        session = open_session(
            plan.model,
            backend=backend,
            dtype=plan.dtype,
            device=plan.device,
            speculator=plan.speculator if speculates else None,
            notify=log,
        )
        model, tokenizer, speculator = session.model, session.tokenizer, session.speculator
        methods = {name: bench_method(name, plan, speculator) for name in plan.methods}
        warm = ids_of(tokenizer, min(plan.lengths))
        for name, method in methods.items():  # first calls allocate, compile and fill caches
            _one_run(session, warm, method, 2)
            done(f"{backend} warm-up {name}")
        for length in plan.lengths:
            ids = ids_of(tokenizer, length)
            if "auto" in methods:  # its calibrations for this length made before the clock runs
                auto_choice(model, methods["auto"], len(ids))
            # the methods in turn, `repeats` rounds: a machine whose speed drifts over minutes slows
            # every method's runs alike, rather than all of one method's
            runs: dict[str, list[dict]] = {name: [] for name in methods}
            for round_ in range(plan.repeats):
                for name, method in methods.items():
                    runs[name].append(_one_run(session, ids, method, plan.decode_tokens))
                    done(f"{backend} {name} {length}")
                    if round_ == plan.repeats - 1:  # the row is complete: kept at once (a stop loses no other)
                        _finish_row(rows, runs[name], backend, model.device_name, name, length, log)
                        if row_done is not None:
                            _add_ratios(rows)
                            row_done(result)
        if calibrate:
            result["calibration"] += _calibrate(
                plan, model, speculator, [r for r in rows if r["backend"] == backend], log
            )
    _add_ratios(rows)
    result["complete"] = True
    return result


def _finish_row(rows: list[dict], runs: list[dict], backend: str, device: str, name: str, length: int, log) -> None:
    """The row of one (backend, method, length): its best run, every run's TTFT in order; logged."""
    best, times = min(runs, key=lambda r: r["ttft_s"]), [r["ttft_s"] for r in runs]
    row = {"backend": backend, "device": device, "method": name, "prompt_tokens": length}
    rows.append({**row, **best, "ttft_runs_s": times})
    each = "" if len(times) == 1 else f" (runs {', '.join(f'{t:.1f}' for t in times)})"
    log(
        f"{backend} {name:<11} {length:>6} tokens: TTFT {best['ttft_s']:.3f} s{each}, "
        f"decode {best['decode_tps']:.1f} tok/s, kept {best['kept_tokens']}, "
        f"peak memory {best['peak_memory_gb']:.3f} GB"
    )


def _calibrate(plan: BenchPlan, model, speculator, rows: list[dict], log: Callable[[str], None]) -> list[dict]:
    """Per sparse method benched: the crossover of these rows (TTFT, whole model), and `auto`'s
    calibration on this machine refreshed: re-probed, or with plan.save_crossover replaced by
    the bench's own measurement (core/crossover.py)."""
    full = {r["prompt_tokens"]: r["ttft_s"] for r in rows if r["method"] == "full"}
    entries = []
    for name in [m for m in plan.methods if m not in ("full", "auto")]:
        auto = bench_method(name, plan, speculator, auto=True)
        points = {
            r["prompt_tokens"]: (full[r["prompt_tokens"]], r["ttft_s"])
            for r in rows
            if r["method"] == name and r["prompt_tokens"] in full
        }
        if plan.save_crossover and points:
            saved = save_calibration(key_for(model, auto), points, "specfill bench --save-crossover (TTFT)")
            crossover, source = saved["crossover_tokens"], "this bench (saved for auto)"
        else:
            crossover, source = auto_crossover(model, auto, refresh=True)
        entries.append(
            {
                "backend": rows[0]["backend"] if rows else None,
                "method": name,
                "auto_crossover": crossover,
                "auto_source": source,
                "bench_crossover": crossover_from_points(points) if points else None,
            }
        )
        log(f"auto on this machine: {name} from {crossover} tokens ({source})")
    return entries


def _add_ratios(rows: list[dict]) -> None:
    full = {(r["backend"], r["prompt_tokens"]): r for r in rows if r["method"] == "full"}
    for r in rows:
        base = full.get((r["backend"], r["prompt_tokens"]))
        r["ttft_speedup_vs_full"] = base["ttft_s"] / r["ttft_s"] if base else None
        r["decode_vs_full"] = r["decode_tps"] / base["decode_tps"] if base and base["decode_tps"] else None


def _peak(row: dict) -> str:
    if "peak_memory_gb" not in row:  # a result written before peaks were per run
        return "-"
    return f"{row['peak_memory_gb']:.3f}" + ("*" if row.get("peak_memory_scope") == "process" else "")


def _plan_dict(plan: BenchPlan) -> dict:
    return {
        "backends": list(plan.backends),
        "methods": list(plan.methods),
        "lengths": list(plan.lengths),
        "model": plan.model or "demo (SmolLM2-135M-Instruct Q4_1)",
        "speculator": plan.speculator,
        "h2o": vars(plan.h2o),
        "specprefill": asdict(plan.specprefill),
        "decode_tokens": plan.decode_tokens,
        "repeats": plan.repeats,
        "dtype": plan.dtype,
        "device": plan.device,
        "save_crossover": plan.save_crossover,
    }


def _growth(specprefill: dict) -> str:
    """The report's words for keep_growth (absent from plans written before it existed)."""
    g = specprefill.get("keep_growth")
    return "" if g is None else f", tokens kept growing as P^{g} past {specprefill.get('growth_from', GROWTH_FROM)}"


def write_bench(result: dict, out_dir: str | os.PathLike, name: str = "bench") -> list[Path]:
    """<name>.json, <name>.md and <name>_ttft.png in out_dir (the crossovers in the JSON's
    "calibration"; `auto` reads only its own per-machine cache, core/crossover.py)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = out / f"{name}.json", out / f"{name}.md", out / f"{name}_ttft.png"
    partial = json_path.with_suffix(".json.partial")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(partial, json_path)
    lines = [
        *report_head("TTFT benchmark", result, "rows"),
        f"Model: {result['plan']['model']}; device {result['plan']['device'] or 'backend default'}; "
        f"dtype {result['plan']['dtype'] or 'backend default'}; "
        f"H2O S={result['plan']['h2o']['chunk_size']} L={result['plan']['h2o']['local']} "
        f"H={result['plan']['h2o']['heavy']} W={result['plan']['h2o'].get('dense_tail', 0)}; "
        f"SpecPrefill {result['plan']['speculator']} layers {result['plan']['specprefill'].get('layers', 'all')} keep "
        f"{result['plan']['specprefill']['keep_ratio'] or result['plan']['specprefill']['keep_tokens']}"
        f"{_growth(result['plan']['specprefill'])}.",
        "",
        "| backend | method | prompt tokens | TTFT (s) | speed-up vs full | kept | decode tok/s | decode vs full "
        "| peak memory (GB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = f"{r['ttft_speedup_vs_full']:.2f}x" if r["ttft_speedup_vs_full"] else "-"
        decode = f"{r['decode_vs_full']:.2f}x" if r["decode_vs_full"] else "-"
        method = f"auto ({r['ran']})" if r["method"] == "auto" and r.get("ran") else r["method"]
        runs = r.get("ttft_runs_s", [])
        each = f" ({' / '.join(f'{t:.1f}' for t in runs)})" if len(runs) > 1 else ""
        lines.append(
            f"| {r['backend']} | {method} | {r['prompt_tokens']} | {r['ttft_s']:.3f}{each} | {ratio} "
            f"| {r['kept_tokens']} | {r['decode_tps']:.1f} | {decode} | {_peak(r)} |"
        )
    if result["plan"].get("repeats", 1) > 1:
        lines.append(
            f"\nTTFT: the best of {result['plan']['repeats']} runs (each run in brackets, in order); a length's "
            "methods ran in turn, round after round, so the machine's drift fell on every method alike."
        )
    if any("peak_memory_gb" in r for r in result["rows"]):
        lines.append(
            "\nPeak memory: each run's own (CUDA: torch.cuda.max_memory_allocated; MLX: mx.get_peak_memory; "
            "CPU: the process's resident-set high-water mark, VmHWM, reset before each run), weights included; "
            "* marks a peak since the process started (no reset here)."
        )
    for c in result.get("calibration", []):
        lines.append(
            f"\nauto on this machine ({c['backend']}, {c['method']}): from {c['auto_crossover']} tokens "
            f"({c['auto_source']}); this bench's crossover: {c['bench_crossover']}."
        )
    partial = md_path.with_suffix(".md.partial")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, md_path)
    plan, machine = result["plan"], result["machine"]
    plot_ttft(
        result["rows"],
        png_path,
        f"TTFT vs prompt length: {Path(str(plan['model'])).name[:40]}, {plan['dtype'] or 'default dtype'}, "
        f"{plan['device'] or 'default device'}, {machine.get('torch_threads', '?')} thread(s), "
        f"{machine['cpu'][:30]}, load {machine.get('load_average_1min', '?')}",
    )
    paths = [json_path, md_path, png_path]
    return paths
