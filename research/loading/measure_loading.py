"""Peak host memory and time of loading a GGUF into the torch backend: lean path vs shared loader.

    python research/loading/measure_loading.py --out results/loading \
        --case ~/.cache/specfill/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf:bfloat16 \
        --case ~/.cache/specfill/models/SmolLM2-135M-Instruct.Q4_1.gguf:bfloat16

Each (case, loader) runs alone in a fresh subprocess, one after the other. In it: RSS after the
imports (VmRSS, the baseline), then the whole `load` (weights + model + tokenizer), then the
process peak (ru_maxrss) and the bytes the model's tensors hold. "load peak" = peak - baseline,
the memory the load itself needed; the issue's bound is load peak <= 1.3x the loaded weights.
"lean" is backends.torch_cuda.load (tensor by tensor, straight into the dtype); "shared" is what
it did before: core.io.weights.load_weights (every tensor to float32 NumPy) + from_weights.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

LOADERS = ("shared", "lean")


def _status_bytes(field: str) -> int:
    """VmRSS (all resident pages) or RssAnon (heap and other anonymous pages, no code or file pages)."""
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class AnonPeak:
    """Samples RssAnon every 2 ms on a thread: the peak of the memory the load allocated, without
    the shared-library code pages that first use of a torch code path brings in (ru_maxrss counts
    those: a fixed ~0.1 GB that dominates for a small model)."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status_bytes("RssAnon"))
            self._stop.wait(0.002)

    def __enter__(self) -> "AnonPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status_bytes("RssAnon"))


def warm_up_torch() -> None:
    """Build a one-layer model on the meta device (no weights): torch's one-time initialisation of
    module building (~0.08 GB of anonymous memory and as much of code pages, measured) then lands
    in the baseline, whatever the loader; it does not grow with the model."""
    import dataclasses

    import torch

    from specfill.backends.torch_cuda.model import Transformer
    from specfill.core.io.random_model import random_model_args

    with torch.device("meta"):
        Transformer(dataclasses.replace(random_model_args("random:llama-1b"), num_hidden_layers=1))


def measure_one(path: str, dtype: str, loader: str) -> dict:
    """Runs in the child: load once, report bytes and seconds."""
    import torch

    from specfill.backends.torch_cuda import from_weights, load
    from specfill.core.tokenizer import load_tokenizer
    from specfill.core.io.weights import load_weights

    torch.set_num_threads(1)
    warm_up_torch()
    baseline, anon_baseline = _status_bytes("VmRSS"), _status_bytes("RssAnon")
    start = time.perf_counter()
    with AnonPeak() as anon:
        if loader == "lean":
            model, _ = load(path, dtype=dtype, device="cpu")
        else:
            args, weights = load_weights(path)
            model = from_weights(args, weights, dtype=getattr(torch, dtype), device="cpu")
            del weights
            load_tokenizer(path)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in list(model.model.parameters()) + list(model.model.buffers())}
    weights_bytes = sum(storages.values())
    return {"model": Path(path).name, "dtype": dtype, "loader": loader, "seconds": round(seconds, 2),
            "baseline_rss_gb": round(baseline / 1e9, 3), "peak_rss_gb": round(peak / 1e9, 3),
            "load_peak_gb": round((peak - baseline) / 1e9, 3), "weights_gb": round(weights_bytes / 1e9, 3),
            "load_peak_over_weights": round((peak - baseline) / weights_bytes, 3),
            "anon_load_peak_gb": round((anon.peak - anon_baseline) / 1e9, 3),
            "anon_load_peak_over_weights": round((anon.peak - anon_baseline) / weights_bytes, 3)}


def run_case(path: str, dtype: str, loader: str) -> dict:
    """One load in a fresh child process (this script with --child); its JSON row."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", path, dtype, loader], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write(rows: list[dict], runs: list[dict], out: Path) -> None:
    """loading.json (machine, summary rows, every run) and loading.md (the summary table)."""
    from specfill.evaluation.machine import describe_machine, machine_line

    machine = describe_machine()
    out.mkdir(parents=True, exist_ok=True)
    (out / "loading.json").write_text(json.dumps({"machine": machine, "rows": rows, "runs": runs}, indent=2) + "\n")
    lines = ["# Torch loading: peak host memory and time, lean vs shared loader", "",
             f"Machine: {machine_line(machine)}.", "",
             "Each row is one fresh process (`research/loading/measure_loading.py`), loading (weights, model, tokenizer) "
             "on the CPU with one torch thread. load peak = peak RSS (ru_maxrss) - RSS after the imports; "
             "anon load peak = the same for anonymous memory (RssAnon sampled every 2 ms), i.e. without the "
             "torch library code pages. Before the baseline, a one-layer model is built on the meta device so "
             "that torch's one-time initialisation (~0.16 GB, not growing with the model) is not counted as "
             "loading. The bound: load peak <= 1.3x "
             "the loaded weights. Per row: the fastest of the runs' load times, the largest of their memory "
             "figures (every run is in loading.json).", "",
             "| model | dtype | loader | runs | best load s | weights GB | baseline RSS GB | peak RSS GB | load peak GB "
             "| load peak / weights | anon load peak / weights |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['loader']} | {r['runs']} | {r['seconds']} | {r['weights_gb']} | "
                     f"{r['baseline_rss_gb']} | {r['peak_rss_gb']} | {r['load_peak_gb']} | "
                     f"{r['load_peak_over_weights']} | {r['anon_load_peak_over_weights']} |")
    (out / "loading.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure_one(*sys.argv[2:5])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True, help="PATH:DTYPE (repeatable)")
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--repeats", type=int, default=3, help="runs per case and loader, interleaved")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    runs = []
    for case in args.case:
        path, dtype = case.rsplit(":", 1)
        for _ in range(args.repeats):
            for loader in args.loaders.split(","):
                runs.append(run_case(os.path.expanduser(path), dtype, loader))
                print(json.dumps(runs[-1]), flush=True)
    write(summarise(runs), runs, Path(args.out))


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (model, dtype, loader): the fastest run's time, the worst run's memory."""
    rows: dict[tuple, dict] = {}
    for run in runs:
        key = (run["model"], run["dtype"], run["loader"])
        row = rows.setdefault(key, {**run, "runs": 0})
        row["runs"] += 1
        row["seconds"] = min(row["seconds"], run["seconds"])
        for field in ("peak_rss_gb", "load_peak_gb", "load_peak_over_weights", "anon_load_peak_gb",
                      "anon_load_peak_over_weights"):
            row[field] = max(row[field], run[field])
    return list(rows.values())


if __name__ == "__main__":
    main()
