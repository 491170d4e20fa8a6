"""MLX runtime speed: full-attention prefill and decode tokens/s of specfill's MLX backend.

Runs the public path (`load` + `generate_step`, method "full", greedy) for each weight variant:
"native" keeps the checkpoint's quantized layers (GGUF Q4_1/Q8_0 of the demo model) and computes
in float32 on CPU / the checkpoint's float type on a Metal GPU; "float32"/"float16"/"bfloat16"
dequantize every layer at load. Prefill tok/s = prompt tokens / time to first token; decode
tok/s over the following tokens. Rows are merged into research/runtimes/results/bench_mlx_runtime_<host>.json and
.md by (BLAS, device, weights, prompt length), so runs with another BLAS add to the same table.
The same command works on Linux (MLX CPU) and on an Apple-silicon Mac (Metal):

    python research/runtimes/bench_mlx_runtime.py                      # demo GGUF, native + float32
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python research/runtimes/bench_mlx_runtime.py
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from specfill.backends.mlx import load
from specfill.core.driver import CausalLM
from specfill.core.io.demo_model import require_demo_model
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig


def cpu_name() -> str:
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], check=True,
                                  capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def blas_in_use() -> str:
    """Which BLAS serves MLX's CPU matmuls: Accelerate on macOS; on Linux the wheel's bundled
    BLAS unless one is LD_PRELOAD-ed (its symbols then win). NumPy's own BLAS is left out."""
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    try:
        with open("/proc/self/maps") as f:
            paths = {Path(line.split()[-1]) for line in f if "/" in line}
    except OSError:
        paths = set()
    libs = sorted(p.name for p in paths  # the wheel's own copies live in mlx_cpu.libs
                  if "blas" in p.name.lower() and p.parent.name.startswith("mlx"))
    preload = [Path(p).name for p in os.environ.get("LD_PRELOAD", "").split(":") if p]
    preloaded = [p for p in preload if "blas" in p.lower()]
    if preloaded:
        return f"{', '.join(preloaded)} (LD_PRELOAD) over {', '.join(libs)}"
    return f"bundled reference BLAS ({', '.join(libs) or 'unknown'})"


class OtherLoad:
    """Average number of cores other processes used while we measured (Linux /proc/stat)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        return busy, sum(os.times()[:2]), time.monotonic()

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return round(max(others, 0.0) / (end[2] - self.start[2]), 2)


def run_once(model: CausalLM, ids: list[int], decode_tokens: int) -> tuple[float, float]:
    """(seconds to the first token, decode tokens/s over the rest)."""
    start = time.perf_counter()
    stamps = []
    for _ in model.generate_step(ids, max_tokens=decode_tokens + 1, sampling=SamplingConfig(),
                                 stop_ids=frozenset(), method=PrefillMethod(), info=GenerationInfo()):
        stamps.append(time.perf_counter())
    return stamps[0] - start, decode_tokens / (stamps[-1] - stamps[0])


def measure(model: CausalLM, prompt: list[int], lengths: list[int], repeats: int,
            decode_tokens: int) -> list[dict[str, Any]]:
    run_once(model, prompt[:32], 2)  # warm-up: allocator, kernels, compiled graphs
    rows = []
    for n in lengths:
        ttfts, decodes = zip(*(run_once(model, prompt[:n], decode_tokens) for _ in range(repeats)))
        ttft = statistics.median(ttfts)
        rows.append({"tokens": n, "ttft_s": round(ttft, 3), "prefill_tok_s": round(n / ttft, 1),
                     "decode_tok_s": round(statistics.median(decodes), 1),
                     "ttft_runs_s": [round(t, 3) for t in ttfts]})
        print(f"  {n:6d} tokens: prefill {n / ttft:8.1f} tok/s   decode "
              f"{rows[-1]['decode_tok_s']:6.1f} tok/s", flush=True)
    return rows


def row_key(row: dict[str, Any]) -> tuple:
    """A newer run replaces the row of the same BLAS, device, weights and prompt length."""
    return row["blas"], row["device"], row["weights"], row["tokens"]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    m = result["machine"]
    lines = ["# MLX runtime: full prefill and decode (specfill MLX backend)", "",
             f"- model: {result['model']}",
             f"- machine: {m['cpu']}, {m['cpu_count']} cores, {m['platform']}",
             f"- mlx {m['mlx']}, Metal available: {m['metal']}",
             "- prefill tok/s = prompt tokens / time to first token (prefill + last-token logits +"
             " greedy pick); decode tok/s over the following tokens; medians of the repeats",
             "- native = the checkpoint's quantized layers kept (quantized matmul); float32 etc. ="
             " dequantized at load",
             "- on Linux MLX runs on CPU only: these figures check the runtime, they say nothing"
             " about Apple silicon; OpenBLAS rows ran with LD_PRELOAD of Debian's"
             " libopenblas0-pthread", "",
             "| BLAS | device | weights | activations | prompt tokens | prefill tok/s | "
             "decode tok/s | TTFT s | other cores busy | measured |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['blas']} | {r['device']} | {r['weights']} | {r['activations']} | "
                     f"{r['tokens']} | {r['prefill_tok_s']} | {r['decode_tok_s']} | "
                     f"{r['ttft_s']} | {r['other_cores']} | {r['date']} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF file or model directory "
                                                   "(default: the demo model)")
    parser.add_argument("--weights", default="native,float32",
                        help="comma-separated: native, float32, float16, bfloat16")
    parser.add_argument("--device", default=None, help="cpu | gpu (default: MLX's default)")
    parser.add_argument("--lengths", default="512,1024")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    path = args.model or require_demo_model()
    lengths = [int(n) for n in args.lengths.split(",")]
    blas, date = blas_in_use(), time.strftime("%Y-%m-%d")
    print(f"BLAS: {blas}")

    new_rows = []
    for variant in args.weights.split(","):
        start = time.perf_counter()
        model, _ = load(path, dtype=None if variant == "native" else variant, device=args.device)
        load_s = time.perf_counter() - start
        weights = "quantized (kept)" if model.quantized else f"dequantized {variant}"
        activations = str(model.dtype).removeprefix("mlx.core.")
        device = "gpu" if model.ops.device.type == mx.DeviceType.gpu else "cpu"
        print(f"{variant}: {weights}, activations {activations}, {device}, load {load_s:.2f} s")
        rng = np.random.default_rng(0)
        prompt = rng.integers(100, model.args.vocab_size, max(lengths)).tolist()
        other = OtherLoad()
        rows = measure(model, prompt, lengths, args.repeats, args.decode_tokens)
        busy = other.cores()
        for row in rows:
            new_rows.append({"blas": blas if device == "cpu" else "n/a (Metal GPU)",
                             "device": device, "weights": weights, "activations": activations,
                             "load_s": round(load_s, 2), "other_cores": busy, "date": date,
                             "prefill_step_size": model.prefill_step_size,
                             "peak_memory_gb": round(model.peak_memory_gb(), 3), **row})
        del model

    machine = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
               "mlx": mx.__version__, "metal": mx.metal.is_available(),
               "python": platform.python_version()}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"bench_mlx_runtime_{slug(machine['cpu'])}-{machine['cpu_count']}c"
    old_rows = []
    if stem.with_suffix(".json").is_file():
        old_rows = json.loads(stem.with_suffix(".json").read_text()).get("rows", [])
    replaced = {row_key(r) for r in new_rows}
    rows = [r for r in old_rows if row_key(r) not in replaced] + new_rows
    result = {"model": Path(path).name, "machine": machine, "repeats": args.repeats,
              "decode_tokens": args.decode_tokens, "rows": rows,
              "command": " ".join(["research/runtimes/bench_mlx_runtime.py", *(argv or sys.argv[1:])])}
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(stem.with_suffix(".md"), result)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
