"""Prefill speed through the mlx-lm adapter against mlx-lm's own generate and specfill's own model,
on one GGUF checkpoint of an own family (MLX CPU, float32): issue 21 item 5.

The GGUF is loaded into specfill's own model (dequantized to float32) and the same arrays are
loaded, by their Hugging Face names (mlx-lm's), into mlx-lm's model class for the config mlx-lm
would read from a converted directory (`load_weights(strict=True)` checks every name and shape;
shared arrays, no second copy in memory). One run times, per prompt length (random ids):

  mlx-lm     `mlx_lm.generate.generate_step(max_tokens=0)`: mlx_lm.generate's own prefill (the
             prompt but its last token in steps of 2048, then the last token's logits and token)
  adapter    specfill's generate through the adapted mlx-lm model: time to the first token with
             full prefill, H2O (defaults) and SpecPrefill (keep 0.1)
  own        the same three methods through specfill's own model

SpecPrefill's speculator is one specfill model (`--speculator` GGUF) for both main-model paths.
Paths run round-robin within each repeat (load from other jobs falls on all of them alike);
each figure is the best of `--repeats`. Writes research/adapter_speed/results/prefill_<model>.{json,md,png}
(`--merge` keeps earlier rows and adds this run to a length's runs: `--paths` splits a length
over runs when one run would not fit in a time limit; every ratio is taken within one run).

    flock /work/model.lock timeout 580 env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python research/adapter_speed/bench_adapter_prefill.py MAIN.gguf --speculator SMALL.gguf --lengths 1024
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specfill.backends.mlx import load
from specfill.backends.mlx.adapted import AdaptedOps, adapt
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.driver import CausalLM
from specfill.core.methods.h2o import uses_full_attention
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine, machine_line

METHODS = ("full", "h2o", "specprefill")
ADAPTER_TARGET, SPEEDUP_TARGET = 1.05, 0.10  # issue 21 item 5: within 5% of mlx-lm, speed-ups within 10%


def mlx_lm_model(own: CausalLM):
    """mlx-lm's model for the own model's config, holding the own model's float32 arrays."""
    from mlx_lm.utils import load_model

    args = own.args
    config = {"model_type": args.architecture, "hidden_size": args.hidden_size, "vocab_size": args.vocab_size,
              "intermediate_size": args.intermediate_size, "num_hidden_layers": args.num_hidden_layers,
              "num_attention_heads": args.num_attention_heads, "num_key_value_heads": args.num_key_value_heads,
              "rms_norm_eps": args.rms_norm_eps, "rope_theta": args.rope_theta,
              "max_position_embeddings": args.max_position_embeddings,
              "tie_word_embeddings": args.tie_word_embeddings}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        lm, _ = load_model(Path(tmp), lazy=True, strict=False)  # its random init is never evaluated
    lm.load_weights(tree_flatten(own.model.parameters()), strict=True)
    return lm


def timers(own: CausalLM, speculator: CausalLM, lm) -> dict[str, Callable[[list[int]], dict]]:
    """path name -> run(prompt ids) that stops at the first token (the paths of the module doc) and
    returns its stages' seconds (specfill's GenerationInfo.seconds; {} for mlx-lm)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    adapted = CausalLM(adapt(lm), AdaptedOps(mx.Device(mx.cpu)), prefill_step_size=own.prefill_step_size)
    methods = {"full": PrefillMethod(), "h2o": PrefillMethod("h2o"),
               "specprefill": PrefillMethod("specprefill", speculator=speculator,
                                            specprefill=SpecPrefillConfig(keep_ratio=0.1))}

    def library(ids: list[int]) -> dict:
        for _ in generate_step(mx.array(ids, dtype=mx.int32), lm, max_tokens=0, prompt_cache=make_prompt_cache(lm),
                               prefill_step_size=own.prefill_step_size):
            pass
        return {}

    def specfill(model: CausalLM, method: PrefillMethod) -> Callable[[list[int]], dict]:
        def run(ids: list[int]) -> dict:
            info = GenerationInfo()
            next(model.generate_step(ids, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(),
                                     method=method, info=info))
            return dict(info.seconds)
        return run

    paths = {"mlx-lm full": library}
    for name in METHODS:
        paths[f"adapter {name}"] = specfill(adapted, methods[name])
        paths[f"own {name}"] = specfill(own, methods[name])
    return paths


def measure(paths: dict[str, Callable[[list[int]], dict]], n: int, repeats: int) -> dict:
    """One length: every path's seconds per repeat (round-robin), the load average after each and
    the stages' seconds of each path's last repeat.
    H2O with the defaults is plain causal attention on a prompt of one chunk: not timed there."""
    ids = np.random.default_rng(0).integers(10, 1000, n).tolist()
    skipped = [name for name in paths if name.endswith(" h2o") and uses_full_attention(H2OConfig(), n)]
    seconds: dict[str, list[float]] = {name: [] for name in paths if name not in skipped}
    load, stages = [], {}
    with mx.stream(mx.cpu):
        for _ in range(repeats):
            for name in seconds:
                start = time.perf_counter()
                stages[name] = paths[name](ids)
                seconds[name].append(time.perf_counter() - start)
                load.append(os.getloadavg()[0])
                print(f"{n} {name}: {seconds[name][-1]:.2f} s (load {load[-1]:.2f})", file=sys.stderr, flush=True)
    return {"tokens": n, "seconds": seconds, "load_average_1min": [min(load), max(load)],
            "stage_seconds": stages, "h2o_full_attention": bool(skipped)}


def derive(row: dict) -> dict:
    """A length's runs (a row of `measure` each) -> best seconds per path over them, the ratios and
    the targets' verdicts. Each ratio is taken within one run (the last that timed both paths),
    never across runs; None: no run timed both."""
    runs = row["runs"]
    best = {name: min(t for run in runs for t in run["seconds"].get(name, [])) for run in runs
            for name in run["seconds"]}

    def ratio(a: str, b: str) -> float | None:
        both = [run["seconds"] for run in runs if a in run["seconds"] and b in run["seconds"]]
        return min(both[-1][a]) / min(both[-1][b]) if both else None

    out = {"tokens": row["tokens"], "runs": runs, "best_s": best,
           "load_average_1min": [min(r["load_average_1min"][0] for r in runs),
                                 max(r["load_average_1min"][1] for r in runs)],
           "adapter_over_mlx_lm": ratio("adapter full", "mlx-lm full"), "own_over_mlx_lm": ratio("own full", "mlx-lm full")}
    over = out["adapter_over_mlx_lm"]
    verdict = {"adapter_within_5pct_of_mlx_lm": None if over is None else over <= ADAPTER_TARGET}
    for method in METHODS[1:]:
        ups = {path: ratio(f"{path} full", f"{path} {method}") for path in ("adapter", "own")}
        both = None not in ups.values()
        out[f"{method}_speedup"] = ups
        out[f"{method}_speedup_ratio"] = ups["adapter"] / ups["own"] if both else None
        verdict[f"{method}_speedup_within_10pct"] = \
            abs(out[f"{method}_speedup_ratio"] - 1) <= SPEEDUP_TARGET if both else None
    out["within_target"] = verdict
    return out


def _fmt(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _verdict(value: bool | None) -> str:
    return "not timed" if value is None else ("met" if value else "missed")


def markdown(result: dict) -> str:
    lines = [f"# Prefill through the mlx-lm adapter: {result['model']}", "",
             f"{result['dtype']}, {result['device']}, {result['threads']} thread(s); speculator "
             f"{result['speculator']} (keep 0.1); H2O defaults. Machine: {machine_line(result['machine'])}.",
             "Shared machine under load from other jobs (load average per row below): not quiet-machine figures.",
             "Seconds to the first token, best over repeats and runs, paths round-robin within a run; every "
             "ratio within one run (a length split over runs by --paths says so). Targets (issue 21 "
             "item 5): adapter full <= 1.05x mlx-lm; adapter speed-ups within 10% of the own model's. H2O at "
             "<= 1024 tokens (one chunk) is full attention: not timed.", "",
             "| tokens | mlx-lm full | adapter full | own full | adapter / mlx-lm | H2O speed-up adapter / own "
             "| SpecPrefill speed-up adapter / own | load |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        best, cells = row["best_s"], []
        for method in METHODS[1:]:
            ups = row[f"{method}_speedup"]
            cells.append(f"{_fmt(ups['adapter'], '.2f')}x / {_fmt(ups['own'], '.2f')}x "
                         f"({_fmt(row[f'{method}_speedup_ratio'], '.3f')})")
        split = f" ({len(row['runs'])} runs)" if len(row["runs"]) > 1 else ""
        lines.append(f"| {row['tokens']}{split} | " + " | ".join(_fmt(best.get(f"{p} full"), ".1f") + " s"
                                                          for p in ("mlx-lm", "adapter", "own"))
                     + f" | {_fmt(row['adapter_over_mlx_lm'], '.3f')} | {cells[0]} | {cells[1]} | "
                     f"{row['load_average_1min'][0]:.1f}-{row['load_average_1min'][1]:.1f} |")
    lines += ["", "Targets under that load: " + "; ".join(
        f"{row['tokens']} tokens: " + ", ".join(f"{k} {_verdict(v)}" for k, v in row["within_target"].items())
        for row in result["rows"]), ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Left: full prefill seconds per path; right: H2O / SpecPrefill speed-ups, adapter vs own."""
    from specfill.evaluation.plots import _pyplot, _save

    plt, rows = _pyplot(), result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(rows))
    for i, name in enumerate(("mlx-lm full", "adapter full", "own full")):
        left.bar(x + (i - 1) * 0.27, [r["best_s"].get(name, 0.0) for r in rows], 0.27, label=name)
    bars = [("h2o", "adapter"), ("h2o", "own"), ("specprefill", "adapter"), ("specprefill", "own")]
    for i, (method, way) in enumerate(bars):
        right.bar(x + (i - 1.5) * 0.2, [r[f"{method}_speedup"][way] or 0.0 for r in rows], 0.2,
                  label=f"{method} {way}")
    right.axhline(1.0, color="grey", lw=0.8)
    for axis, label in ((left, "seconds to first token, full prefill"),
                        (right, "speed-up over the path's own full prefill")):
        axis.set_xticks(x, [str(r["tokens"]) for r in rows])
        axis.set_xlabel("prompt tokens (0 / missing bar: not timed)")
        axis.set_ylabel(label)
        axis.legend(fontsize=8)
    load = max(r["load_average_1min"][1] for r in rows)
    fig.suptitle(f"{result['model']} · {result['dtype']} · {result['device']} · {result['threads']} threads "
                 f"(shared machine, load up to {load:.1f})")
    _save(fig, path)
    plt.close(fig)


def merged(out: Path, rows: list[dict]) -> list[dict]:
    """This run's rows ({"tokens", "runs": [one run]}) joined with the file's: other lengths kept,
    a length timed again gets this run appended to its runs."""
    earlier = {row["tokens"]: row for row in json.loads(out.read_text())["rows"]} if out.exists() else {}
    for row in rows:
        old = earlier.pop(row["tokens"], None)
        if old is not None:
            row["runs"] = old["runs"] + row["runs"]
    return list(earlier.values()) + rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf")
    parser.add_argument("--speculator", required=True, help="GGUF of SpecPrefill's speculator (own model)")
    parser.add_argument("--lengths", default="1024")
    parser.add_argument("--paths", default="", help="comma-separated path names to time (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--merge", action="store_true", help="keep the earlier rows and paths not timed now")
    options = parser.parse_args()
    for name in (options.gguf, options.speculator):
        if not Path(name).is_file():
            parser.error(f"no such file: {name}")
    own, _ = load(options.gguf, dtype="float32", device="cpu")
    speculator, _ = load(options.speculator, dtype="float32", device="cpu")
    paths = timers(own, speculator, mlx_lm_model(own))
    wanted = [name.strip() for name in options.paths.split(",") if name.strip()] or list(paths)
    if set(wanted) - set(paths):
        parser.error(f"unknown paths {sorted(set(wanted) - set(paths))}; known: {', '.join(paths)}")
    out = Path(__file__).resolve().parent / "results" / f"prefill_{Path(options.gguf).stem}.json"
    rows = [{"tokens": int(n), "runs": [measure({k: paths[k] for k in wanted}, int(n), options.repeats)]}
            for n in options.lengths.split(",")]
    rows = merged(out, rows) if options.merge else rows
    result = {"model": Path(options.gguf).name, "speculator": Path(options.speculator).name, "dtype": "float32",
              "device": "MLX CPU", "threads": own.ops.compute_threads, "repeats": options.repeats,
              "machine": describe_machine(), "targets": {"adapter_over_mlx_lm": ADAPTER_TARGET,
                                                         "speedup_ratio_within": SPEEDUP_TARGET},
              "rows": [derive(row) for row in sorted(rows, key=lambda row: row["tokens"])]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    plot(result, out.with_suffix(".png"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
