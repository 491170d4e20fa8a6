"""Where H2O's CPU time goes, stage by stage, against full prefill's SDPA, per layer (issue 26 item 1).

One layer's attention at a model's head shape on random post-RoPE q/k/v, torch backend on CPU
(the twins): full prefill as the driver runs it (causal steps of 2,048 queries, torch's CPU flash
kernel) against `h2o_attention_layer` with every `TorchOps` stage timed separately (phase 1
intra, phase 2 inter, the exact merge, column-sum reductions, score accumulation, memory-set
choice, gathers, concatenations; the dense tail's share apart). Best of --repeats after a
warm-up. Work is counted in q.k products per head (core/methods/h2o.py): H2O's rate in products
per second over full prefill's is how close its CPU path runs to SDPA per unit of work.

    python scripts/profile_h2o_cpu.py --shape smollm2 --dtypes float32 bfloat16 --threads 1
    python scripts/profile_h2o_cpu.py --shape qwen1.5b --lengths 2048 4096 --out results/bench/x

Writes <out>.json, <out>.md and <out>.png (title: shape, dtypes, device, threads).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import torch

from specfill.backends.torch_cuda.attention import causal_attention as causal_step
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core import H2OConfig
from specfill.core.methods import h2o
from specfill.evaluation.machine import describe_machine, machine_line

SHAPES = {"smollm2": (9, 3, 64), "qwen1.5b": (12, 2, 128)}  # (query heads, KV heads, head dim)
STAGES = ("intra_attention", "inter_attention", "merge_states", "reduce_colsum_to_kv_heads", "accumulate_scores",
          "build_memory_set", "gather_memory", "concat", "cast_like")
STEP = 2048  # the driver's prefill step (core/driver.py DEFAULT_PREFILL_STEP_SIZE)


class TimedOps(TorchOps):
    """TorchOps with each H2O stage's wall time added to `seconds[stage]` (the dense tail's to
    `seconds["tail:" + stage]`)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__(torch.device("cpu"), dtype, use_kernels=False)
        self.seconds: dict[str, float] = defaultdict(float)
        self.prefix = ""
        for stage in STAGES:
            setattr(self, stage, self._timed(stage, getattr(self, stage)))

    def _timed(self, stage, fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[self.prefix + stage] += time.perf_counter() - started
            return out
        return run


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> None:
    """Full prefill's attention of one layer: causal steps of STEP queries over every key so far."""
    for lo in range(0, q.shape[1], STEP):
        hi = min(lo + STEP, q.shape[1])
        causal_step(q[None, :, lo:hi], k[None, :, :hi], v[None, :, :hi], scale)


def profile(shape: tuple[int, int, int], n: int, dtype: torch.dtype, config: H2OConfig, repeats: int) -> dict:
    heads, kv_heads, dim = shape
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(n, heads, dim, generator=gen).transpose(0, 1).to(dtype)  # the model's [T, H, D] view
    k, v = (torch.randn(kv_heads, n, dim, generator=gen).to(dtype) for _ in range(2))
    scale = dim ** -0.5
    ops = TimedOps(dtype)
    tail = h2o.dense_tail_attention

    def tail_timed(*args, **kwargs):
        ops.prefix = "tail:"
        try:
            return tail(*args, **kwargs)
        finally:
            ops.prefix = ""
    h2o.dense_tail_attention = tail_timed
    best_full, best_h2o, best_stages = float("inf"), float("inf"), {}
    try:
        for attempt in range(repeats + 1):  # the first is a warm-up
            started = time.perf_counter()
            full_attention(q, k, v, scale)
            full = time.perf_counter() - started
            ops.seconds.clear()
            started = time.perf_counter()
            h2o.h2o_attention_layer(ops, q, k, v, config, scale)
            total = time.perf_counter() - started
            if attempt:
                best_full = min(best_full, full)
                if total < best_h2o:
                    best_h2o, best_stages = total, dict(ops.seconds)
    finally:
        h2o.dense_tail_attention = tail
    best_stages["walk (rest)"] = best_h2o - sum(best_stages.values())
    work_full = h2o.full_dot_products(n)
    work_h2o = h2o.h2o_dot_products(n, config.chunk_size, config.local + config.heavy, config.dense_tail)
    return {"tokens": n, "dtype": str(dtype).split(".")[-1], "full_s": best_full, "h2o_s": best_h2o,
            "speedup": best_full / best_h2o, "work_ratio": work_h2o / work_full,
            "rate_vs_sdpa": (work_h2o / best_h2o) / (work_full / best_full), "stages_s": best_stages}


def write(rows: list[dict], out: Path, title: str, machine: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"title": title, "machine": machine, "rows": rows}, indent=1))
    lines = [f"# {title}", "", f"Machine: {machine_line(machine)} (shared: other jobs ran; best of the repeats).",
             "", "| dtype | tokens | SDPA full s | H2O s | speed-up | H2O work / full | H2O rate / SDPA rate | "
             "top stages (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["stages_s"].items(), key=lambda kv: -kv[1])[:5])
        lines.append(f"| {r['dtype']} | {r['tokens']} | {r['full_s']:.3f} | {r['h2o_s']:.3f} | {r['speedup']:.2f}x "
                     f"| {r['work_ratio']:.2f} | {r['rate_vs_sdpa']:.2f} | {top} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 5))
    labels = [f"{r['dtype']}\n{r['tokens']}" for r in rows]
    names = sorted({k for r in rows for k in r["stages_s"]})
    bottom = [0.0] * len(rows)
    for name in names:
        values = [max(0.0, r["stages_s"].get(name, 0.0)) for r in rows]
        ax.bar([i + 0.2 for i in range(len(rows))], values, 0.4, bottom=bottom, label=f"H2O {name}")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.bar([i - 0.2 for i in range(len(rows))], [r["full_s"] for r in rows], 0.4, color="black", label="full (SDPA)")
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("seconds per layer")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="results/bench/h2o_cpu_profile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = H2OConfig()
    machine = describe_machine({"load_average_1min_before": round(os.getloadavg()[0], 2)})
    rows = []
    with torch.inference_mode():
        for dtype in args.dtypes:
            for n in args.lengths:
                rows.append(profile(SHAPES[args.shape], n, getattr(torch, dtype), config, args.repeats))
                r = rows[-1]
                print(f"{r['dtype']} {n}: full {r['full_s']:.3f} s, H2O {r['h2o_s']:.3f} s ({r['speedup']:.2f}x), "
                      f"rate vs SDPA {r['rate_vs_sdpa']:.2f}", flush=True)
    machine["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    title = (f"H2O stages vs full prefill (SDPA), one layer, {args.shape} shape {SHAPES[args.shape]}, "
             f"{'/'.join(args.dtypes)}, torch CPU ({machine['cpu'][:30]}), {args.threads} thread(s), "
             f"S={config.chunk_size} L={config.local} H={config.heavy} W={config.dense_tail}")
    write(rows, Path(args.out), title, machine)


if __name__ == "__main__":
    main()
