"""The TTFT / decode step of scripts/gpu_session.sh: random weights of a main and a speculator
shape, every method at every length, medians of repeats, peak memory per method, each beside the
roofline's prediction (evaluation/roofline.py) for this GPU, inside a time budget.

    python scripts/gpu_bench.py --model random:llama-8b --speculator random:llama-1b \
        --lengths 8192,32768,131072 --budget-s 300 --out results/gpu --name ttft

Budget: before each measurement the roofline's prediction times SLACK (the formula is a lower
bound: norms, RoPE, launch gaps and the Python between layers are not priced) says whether one
more run fits the time left; runs that do not fit are skipped and the row says so. The TTFT rows run
longest prompt first (the acceptance lines' lengths; decode runs before them, after the first
--lengths prompt). Results (<name>.json, <name>.md) are rewritten after every row, and once more
on SIGTERM (the `timeout` the session script wraps each step in), so a step out of time keeps what
it measured. A method that fails (an out-of-memory error at 128K, say) is a row with its error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specfill.api import load, load_speculator, prefill_method, stream_generate
from specfill.cli import bench as bench_cli
from specfill.cli.options import h2o_config, specprefill_config
from specfill.core.io.random_model import random_model_args, random_prompt_ids
from specfill.core.runtime import GenerationInfo
from specfill.evaluation.roofline import DEVICES, Method, Shape, decode_seconds, predict

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings gpu_bench_report.py, gpu_clocks.py
import gpu_bench_report  # noqa: E402
from gpu_bench_report import decode_mode, e2e, logits_check, plot, report, row_line, walk_counts, walk_row  # noqa: E402
from gpu_clocks import ClockSampler, annotate  # noqa: E402

# measured / predicted was 1.1-3x on this CPU with its own measured rates (research/roofline/results/
# roofline.md); on vendor peaks a GPU prefill reaching 30-70% of them would be 1.5-3x: 4x is an assumption
# with room, for the GPU run to correct (its rows record the ratio)
SLACK = 4.0
# the warm-up prompt (or the shortest length, if shorter): compiles the Triton kernels and fills
# torch's caches; past H2O's logical batch (4096 at the defaults) so its phase-2 walk runs too
WARM_TOKENS = 5120
# a run's prefill parts (GenerationInfo.seconds) a row keeps, and the roofline parts each one prices
PARTS = {
    "prefill": ("linear", "attention"),
    "speculator": ("speculator", "lookahead"),
    "speculator_pass": ("speculator",),  # the prompt pass alone (the look-ahead: speculator less this)
    "lookahead_setup": (),  # of the look-ahead, its steps' first runs and graph captures (no roofline)
    "selection": ("scoring",),
    "main_prefill": ("main_linear", "main_attention"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="random:llama-8b")
    p.add_argument("--speculator", default="random:llama-1b", help="random:SHAPE (a separate model) or self:K")
    p.add_argument("--lengths", default="8192,32768,131072")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--draft-tokens", type=int, default=4, help="k of the drafting decode row (the speculator drafts)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--compose",
        action="store_true",
        help="add the composition as `auto` runs it from 7,800 tokens (core/config.AUTO_COMPOSITION: SpecPrefill "
        "over an H2O speculator, keep 0.1, window 32, one neighbour); its keep-0.3 form as a --variant",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=METHOD[:FLAGS]",
        help="one more row per length: METHOD (full, h2o, specprefill) with `specfill bench` FLAGS, "
        "e.g. 'h2o-all=h2o:--h2o-layers all' or 'keep-0.1=specprefill:--keep 0.1' (repeatable)",
    )
    p.add_argument("--methods", default=None, help="the rows to run, by name (comma-separated; default: all)")
    p.add_argument(
        "--decode-modes",
        default="graphs,eager-static,eager",
        help="decode rows (comma-separated): graphs (CUDA graphs, the default on a GPU), eager-static (the "
        "same static steps without capture), eager (the layer-by-layer path); tokens compared across them",
    )
    p.add_argument(
        "--compiled-early",
        action="store_true",
        help="the compiled decode row with the other decode rows, before the TTFT rows (its compilation "
        "then takes their time); default: last, and only with --compile-allowance-s left",
    )
    p.add_argument(
        "--compile-allowance-s",
        type=float,
        default=100.0,
        help="the compiled decode row (last) runs only with this much of the budget left (inductor: ~1 min for an 8B)",
    )
    p.add_argument("--roofline", default="auto", help="DEVICES key (h100, h200) or auto: from the GPU's name")
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--out", default="results/gpu")
    p.add_argument("--name", default="ttft", help="NAME.json / NAME.md; e2e.json for ttft, else NAME_e2e.json")
    p.add_argument(
        "--replot",
        metavar="JSON",
        help="no run: draw JSON's TTFT plot (<stem>_ttft.png beside it), for results whose run had no plot",
    )
    p.add_argument("--device-name", help="with --replot: the device for the title where the JSON has none")
    return p.parse_args(argv)


def roofline_key(choice: str, device: str) -> str | None:
    if choice != "auto":
        return choice
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().lower()
    return next((key for key in ("h200", "h100") if key in name), None)


def composition_flags() -> list[str]:
    """`specfill bench` flags of core/config.AUTO_COMPOSITION: the composition `auto` runs on long
    prompts (issue 47), its fields apart from SpecPrefill's defaults. The GPU session's rows before
    2026-11-30 timed `--speculator-prefill h2o` alone (keep 0.3); issue 50's composition line is the
    composition's default, this one."""
    from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
    from specfill.core.request import settings_of

    base, flags = SpecPrefillConfig(), []
    spelled = {SpecPrefillConfig(speculator_prefill="h2o").speculator_prefill: "h2o"}  # the flag's word for it
    for setting in settings_of(SpecPrefillConfig):
        value = getattr(AUTO_COMPOSITION, setting.field)
        if value == getattr(base, setting.field):
            continue
        if not setting.cli or (setting.field == "speculator_prefill" and value not in spelled):
            raise SystemExit(f"AUTO_COMPOSITION's {setting.field}={value!r} has no `specfill bench` flag")
        word = spelled[value] if setting.field == "speculator_prefill" else str(value)
        flags += [setting.cli[0], word]
    return flags


def method_configs(
    compose: bool, variants: list[str] = (), only: str | None = None
) -> dict[str, tuple[str, argparse.Namespace]]:
    """name -> (method, the bench CLI's parsed flags): the defaults, the composition and each
    variant parse their flags through the CLI's own parser, so a row's config is the one
    `specfill bench` would use with those flags. `only` (comma-separated names) keeps those rows."""
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    plain = parser.parse_args([])
    plain.row_step = None
    methods = {"full": ("full", plain), "h2o": ("h2o", plain), "specprefill": ("specprefill", plain)}
    if compose and "--speculator-prefill" not in parser._option_string_actions:
        print("--compose: this checkout's bench has no --speculator-prefill flag: the composition is skipped")
    elif compose:
        # "composition", not the method's name: `specfill bench --methods specprefill+h2o` runs it at
        # the SpecPrefill settings given (keep 0.3 by default), this row at auto's
        methods["composition"] = ("specprefill", parser.parse_args(composition_flags()))
        methods["composition"][1].row_step = None
    for spec in variants:
        name, _, rest = spec.partition("=")
        kind, _, flags = rest.partition(":")
        if not name or kind not in ("full", "h2o", "specprefill"):
            raise SystemExit(f"--variant {spec!r}: expected NAME=METHOD[:FLAGS] with METHOD full, h2o or specprefill")
        words, step = shlex.split(flags), None
        if "--step" in words:  # the main model's prefill step size for this row (a load setting, not bench's)
            at = words.index("--step")
            step = int(words[at + 1])
            del words[at : at + 2]
        eager_walk = "--eager-walk" in words  # H2O's batches without CUDA graphs (TorchOps.walk_capture None)
        words = [w for w in words if w != "--eager-walk"]
        methods[name] = (kind, parser.parse_args(words))
        methods[name][1].row_step = step
        methods[name][1].eager_walk = eager_walk
    if only is not None:
        wanted = only.split(",")
        unknown = [n for n in wanted if n not in methods]
        if unknown:
            raise SystemExit(f"--methods: no row named {', '.join(unknown)} (rows: {', '.join(methods)})")
        methods = {n: methods[n] for n in wanted}
    return methods


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline = time.monotonic() + args.budget_s
        self.result: dict = {"plan": vars(args), "complete": False, "notes": [], "rows": [], "decode": []}
        self.cuda = args.device.startswith("cuda")
        clocks = Path(args.out) / f"{args.name}_clocks.csv"  # the SM clock and power beside the rows
        index, limit = torch.device(args.device).index or 0, args.budget_s + 60
        self.clocks = ClockSampler.start(clocks, index, limit) if self.cuda else None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def note(self, line: str) -> None:
        print(line, flush=True)
        self.result["notes"].append(line)

    def peak_reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self, model) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 1e9
        return model.peak_memory_gb()

    def write(self) -> None:
        out, name = Path(self.args.out), self.args.name
        out.mkdir(parents=True, exist_ok=True)
        files = [(out / f"{name}.json", json.dumps(self.result, indent=1)), (out / f"{name}.md", report(self.result))]
        if self.result.get("e2e"):
            record = {**self.result["e2e"], "device": self.result.get("device_name")}
            files.append((out / ("e2e.json" if name == "ttft" else f"{name}_e2e.json"), json.dumps(record, indent=1)))
        for path, text in files:
            partial = path.with_name(path.name + ".partial")
            partial.write_text(text + "\n")
            os.replace(partial, path)


def one_run(model, tokenizer, ids, method, decode_tokens: int, **drafting) -> dict:
    last, tokens, info, started = None, [], GenerationInfo(), time.time()
    for last in stream_generate(model, tokenizer, ids, decode_tokens, method=method, prefill_info=info, **drafting):
        tokens.append(last.token)
    return {
        "tokens": tokens,
        "setup_s": last.setup_seconds,
        "ttft_s": last.ttft,
        "decode_tps": last.generation_tps,
        "kept_tokens": last.kept_tokens,
        "drafted": last.drafted_tokens,
        "accepted": last.accepted_tokens,
        "ran": getattr(last, "method", None),  # the method the statistics name (specprefill+h2o where it ran)
        # the prefill's parts as the run timed them (the backend's clock waits for the device):
        # prefill; or speculator (its pass and look-ahead), selection (scoring), main_prefill
        "parts_s": {k: round(v, 6) for k, v in info.seconds.items() if k in PARTS},
        "window": [started, time.time()],  # wall clock, for the GPU clocks sampled meanwhile (gpu_clocks.py)
    }


def predicted_ttft(shapes, rates, kind, args_ns, n_tokens, kept) -> float | None:
    """The roofline's TTFT of method `kind` (full, h2o, specprefill) with the parsed flags args_ns."""
    parts = predicted_parts(shapes, rates, kind, args_ns, n_tokens, kept)
    return None if parts is None else parts["ttft"]


def predicted_parts(shapes, rates, kind, args_ns, n_tokens, kept) -> dict[str, float] | None:
    """The roofline's seconds per part (evaluation/roofline.predict's keys, "ttft" their sum) of
    method `kind` with the parsed flags args_ns; None without rates."""
    if rates is None:
        return None
    main, spec = shapes
    h2o, sp = h2o_config(args_ns), specprefill_config(args_ns)
    if kind in ("full", "h2o"):
        return predict(main, rates, n_tokens, Method(kind, h2o=h2o))
    parts = predict(
        main, rates, n_tokens, Method("specprefill", speculator=spec, lookahead=sp.lookahead, kept_tokens=kept)
    )
    spec_h2o = getattr(sp, "speculator_prefill", None)
    if spec_h2o is not None and spec_h2o != "dense":  # the composition: the speculator's prefill runs H2O
        spec_h2o = spec_h2o if isinstance(spec_h2o, type(h2o)) else replace(h2o, layers="all")  # "h2o": every layer
        parts["speculator"] = predict(spec, rates, n_tokens, Method("h2o", h2o=spec_h2o))["ttft"]
    parts["ttft"] = sum(v for k, v in parts.items() if k != "ttft")
    return parts


def _stop(signum, frame) -> None:
    raise SystemExit(124)


def run(args: argparse.Namespace) -> int:
    if args.replot:
        source = Path(args.replot)
        if not source.is_file():
            raise SystemExit(f"--replot: no such file {source}")
        print(plot(json.loads(source.read_text()), source.with_name(source.stem + "_ttft.png"), args.device_name))
        return 0
    bench = Bench(args)
    signal.signal(signal.SIGTERM, _stop)
    try:
        measure(bench)
        bench.result["complete"] = True
    except SystemExit:
        bench.note("stopped from outside (the step's timeout): the rows so far are kept")
        raise
    finally:
        if bench.clocks is not None:  # the samples read once, each row given those inside its runs
            bench.clocks.stop()
            annotate(bench.result, bench.clocks)
        bench.write()
    try:  # a picture of the rows; matplotlib is on the GPU image, and a failed plot loses no result
        plot(bench.result, Path(args.out) / f"{args.name}_ttft.png")
    except Exception as e:
        print(f"no plot: {type(e).__name__}: {e}")
    return 0


def measure(bench: Bench) -> None:
    args = bench.args
    start = time.monotonic()
    key = roofline_key(args.roofline, args.device)
    rates = DEVICES.get(key) if key else None
    bench.result["roofline"] = vars(rates) if rates else None
    bench.result["device_name"] = torch.cuda.get_device_name() if bench.cuda else "CPU"
    model, tokenizer = load(args.model, dtype=args.dtype, device=args.device, backend="cuda")
    speculator = load_speculator(args.speculator, model, tokenizer, args.dtype, args.device)
    main_args = random_model_args(args.model)
    spec_shape = (
        Shape.from_args(args.speculator, random_model_args(args.speculator))
        if args.speculator.startswith("random:")
        else Shape.from_args(args.model, main_args).first_layers(int(args.speculator[5:]))
    )
    shapes = (Shape.from_args(args.model, main_args), spec_shape)
    bench.note(f"loaded {args.model} + {args.speculator} in {time.monotonic() - start:.1f} s; roofline {key}")
    bench.result["weights_gb"] = bench.peak_gb(model)
    configs = method_configs(args.compose, args.variant, args.methods)
    kinds = {name: kind for name, (kind, _) in configs.items()}
    methods = {name: (build_method(kind, ns, speculator), ns) for name, (kind, ns) in configs.items()}
    room = main_args.max_position_embeddings - args.decode_tokens  # prompt + new tokens fit the context
    lengths = [min(int(n), room) for n in args.lengths.split(",")]
    if lengths != [int(n) for n in args.lengths.split(",")]:
        bench.note(f"lengths {lengths}: a prompt and its {args.decode_tokens} new tokens fit the model's context")
    warm = random_prompt_ids(tokenizer.vocab_size, min(WARM_TOKENS, *lengths), seed=1)
    for name, (method, ns) in methods.items():
        try:
            default_step, model.prefill_step_size = model.prefill_step_size, ns.row_step or model.prefill_step_size
            one_run(model, tokenizer, warm, method, 2)
            model.prefill_step_size = default_step
        except Exception as e:  # the rows below say it again, per length
            bench.note(f"warm-up {name} failed: {type(e).__name__}: {e}")
    bench.note(f"warm-ups done at {time.monotonic() - start:.1f} s")
    # decode first: cheap (one short prompt), and a long prefill that overruns the step cannot take it
    modes = [m for m in args.decode_modes.split(",") if m]
    # the compiled row last unless asked early: its compilation cannot take a TTFT row's time
    late = ["compiled"] if "compiled" in modes and not args.compiled_early else []
    early = [m for m in modes if m not in late]
    if "full" in methods:
        drafted = [("graphs", args.draft_tokens)] if args.draft_tokens else []
        decode_rows(bench, model, tokenizer, speculator, methods["full"][0], lengths[0], shapes, rates, early, drafted)
    # the longest prompts first: issue 50's acceptance lines are read at the longest length and at ~32K, and
    # a run the budget no longer affords (the probes' compilations take more of it than they did) is then
    # a short prompt's
    for n in sorted(lengths, reverse=True):
        ids = random_prompt_ids(tokenizer.vocab_size, n, seed=n)
        for name, (method, ns) in methods.items():
            row = {"method": name, "kind": kinds[name], "prompt_tokens": n, "runs": [], "peak_gb": None, "error": None}
            guess = predicted_ttft(shapes, rates, kinds[name], ns, n, None)
            decode_guess = args.decode_tokens * decode_seconds(shapes[0], rates, n, 2) if rates else 0.0
            cost = SLACK * (guess + decode_guess) if guess is not None else 0.0
            step = getattr(ns, "row_step", None)
            row["step"] = step or model.prefill_step_size
            default_step, model.prefill_step_size = model.prefill_step_size, step or model.prefill_step_size
            with walk_row(row, (model, speculator), getattr(ns, "eager_walk", False)) as walking:
                run_row(bench, row, model, tokenizer, ids, method, cost)
            model.prefill_step_size = default_step
            finish_row(row, shapes, rates, ns)
            bench.result["rows"].append(row)
            add_speedups(bench.result["rows"])
            bench.note(row_line(row))
            bench.result["e2e"] = e2e(bench.result, shapes[0])
            if walking:
                bench.result["e2e"]["walk_graphs"] = walk_counts(walking)
            bench.write()
    if late and "full" in methods:
        if bench.left() < args.compile_allowance_s:
            bench.note(f"decode compiled: skipped, {bench.left():.0f} s left < {args.compile_allowance_s:.0f} s")
        else:
            decode_rows(bench, model, tokenizer, speculator, methods["full"][0], lengths[0], shapes, rates, late, [])


def run_row(bench: Bench, row: dict, model, tokenizer, ids, method, cost: float) -> None:
    """A row's runs (args.repeats), each while the budget allows it (a shorter prompt's row may still run
    after a longer one's did not); an error ends the row."""
    args = bench.args
    for _ in range(args.repeats):
        if bench.left() < cost:
            row["error"] = row["error"] or f"out of time ({bench.left():.0f} s left, a run costs ~{cost:.0f} s)"
            break
        try:
            bench.peak_reset()
            row["runs"].append(one_run(model, tokenizer, ids, method, args.decode_tokens))
            row["peak_gb"] = max(row["peak_gb"] or 0.0, bench.peak_gb(model))
        except Exception as e:  # torch.OutOfMemoryError included: the next method still runs
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if bench.cuda:
                torch.cuda.empty_cache()
            break


def build_method(kind: str, ns: argparse.Namespace, speculator):
    """Each method with only its own settings (the others would warn that they do nothing); the
    composition's H2O lives in its SpecPrefillConfig (speculator_prefill)."""
    if kind == "full":
        return prefill_method("full")
    if kind == "h2o":
        return prefill_method("h2o", h2o=h2o_config(ns))
    return prefill_method("specprefill", specprefill=specprefill_config(ns), speculator=speculator)


def finish_row(row: dict, shapes, rates, ns) -> None:
    runs = row["runs"]
    if runs:
        row["ttft_s"] = statistics.median(r["ttft_s"] for r in runs)
        row["decode_tps"] = statistics.median(r["decode_tps"] for r in runs)
        row["kept_tokens"] = runs[0]["kept_tokens"]
        predicted = predicted_parts(shapes, rates, row["kind"], ns, row["prompt_tokens"], row["kept_tokens"])
        row["predicted_s"] = None if predicted is None else predicted["ttft"]
        row["measured_over_predicted"] = row["ttft_s"] / row["predicted_s"] if row["predicted_s"] else None
        row["parts"] = row_parts(runs, predicted)


def row_parts(runs: list[dict], predicted: dict[str, float] | None) -> dict[str, dict[str, float | None]]:
    """{part: {"measured_s": median over the runs, "predicted_s": the roofline's parts it covers}}
    for every part the runs timed (PARTS): where a method's time goes, against where it should."""
    parts: dict[str, dict[str, float | None]] = {}
    for name, priced in PARTS.items():
        times = [r["parts_s"][name] for r in runs if name in r.get("parts_s", {})]
        if not times:
            continue
        guess = sum(predicted.get(k, 0.0) for k in priced) if predicted and priced else None
        parts[name] = {"measured_s": statistics.median(times), "predicted_s": guess}
    return parts


def add_speedups(rows: list[dict]) -> None:
    full = {r["prompt_tokens"]: r.get("ttft_s") for r in rows if r["method"] == "full"}
    for r in rows:
        base = full.get(r["prompt_tokens"])
        r["speedup_vs_full"] = base / r["ttft_s"] if base and r.get("ttft_s") else None


def decode_rows(bench: Bench, model, tokenizer, speculator, full, n_tokens: int, shapes, rates, modes, drafted) -> None:
    """Decode tokens/s after a full prefill of n_tokens, per decode mode (warm: one run first, then
    medians of the repeats; graph capture reported apart as setup_s), greedy tokens compared with
    the eager path's; then with the speculator drafting (graphs)."""
    args = bench.args
    ids = random_prompt_ids(tokenizer.vocab_size, n_tokens, seed=n_tokens)
    predicted = 1.0 / decode_seconds(shapes[0], rates, n_tokens, 2) if rates else None
    guess = predict(shapes[0], rates, n_tokens, Method("full"))["ttft"] if rates else 0.0
    if "eager" in modes and "eager-static" in modes:
        try:
            bench.result["logits_check"] = logits_check(model, ids[:2048])
        except Exception as e:
            bench.result["logits_check"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        bench.note(f"logits check: {bench.result['logits_check']}")
    for mode, k in [(m, 0) for m in modes] + drafted:
        row = {"mode": mode, "draft_tokens": k, "prompt_tokens": n_tokens, "predicted_plain_tps": predicted}
        row["error"] = None
        if bench.left() < SLACK * (guess + args.decode_tokens / (predicted or math.inf)) * (args.repeats + 1):
            row["error"] = f"out of time ({bench.left():.0f} s left)"
        else:
            try:
                decode_mode(model, mode)
                drafting = {"draft_model": speculator, "num_draft_tokens": k} if k else {}
                first = one_run(model, tokenizer, ids, full, args.decode_tokens, **drafting)  # warm: captures
                runs = [
                    one_run(model, tokenizer, ids, full, args.decode_tokens, **drafting) for _ in range(args.repeats)
                ]
                row.update({key: value for key, value in runs[-1].items() if key != "decode_tps"})
                row["decode_tps"] = statistics.median(r["decode_tps"] for r in runs)
                row["runs_tps"] = [r["decode_tps"] for r in runs]
                row["first_run_tps"], row["first_run_setup_s"] = first["decode_tps"], first["setup_s"]
                # drafting's costs, measured in the first run, may turn it off for the next (draft_costs.py)
                row["first_run_drafted"], row["first_run_accepted"] = first["drafted"], first["accepted"]
                row.update(gpu_bench_report.graph_state(model.ops))  # whether every step ran as a replayed graph
                if mode == "eager" and not k:
                    bench.eager_tokens = row["tokens"]
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            finally:
                decode_mode(model, "graphs")
        bench.result["decode"].append(row)
    reference_tokens = getattr(bench, "eager_tokens", None)
    for row in bench.result["decode"][-len(modes) - len(drafted) :]:
        if reference_tokens is not None and row.get("tokens") is not None:
            same = sum(a == b for a, b in zip(row["tokens"], reference_tokens))
            row["tokens_equal_eager"] = f"{same}/{len(reference_tokens)}"
        bench.note(
            f"decode {row['mode']} k={row['draft_tokens']}: {row.get('decode_tps') or 0.0:.1f} tok/s, "
            f"setup {row.get('setup_s') or 0.0:.3f} s, tokens equal to eager {row.get('tokens_equal_eager', '-')} "
            f"{row['error'] or ''}"
        )
    bench.result["e2e"] = e2e(bench.result, shapes[0])
    bench.write()


if __name__ == "__main__":
    sys.exit(run(parse_args()))
