"""Where H2O's CPU time goes, stage by stage, against full prefill's SDPA, per layer (issue 26 item 1).

One layer's attention at a model's head shape on random post-RoPE q/k/v, torch backend on CPU
(the twins): full prefill as the driver runs it (causal steps of 2,048 queries, torch's CPU flash
kernel) against `h2o_attention_layer` with every `TorchOps` stage timed separately (phase 1
intra, phase 2 inter, the exact merge, column-sum reductions, score accumulation, memory-set
choice, gathers, concatenations; the dense tail's share apart). Best of --repeats after a
warm-up. Work is counted in q.k products per head (core/methods/h2o.py): H2O's rate in products
per second over full prefill's is how close its CPU path runs to SDPA per unit of work.

    python research/h2o_cpu/profile_h2o_cpu.py --shape smollm2 --dtypes float32 bfloat16 --threads 1
    python research/h2o_cpu/profile_h2o_cpu.py --shape qwen1.5b --lengths 2048 4096 --out research/h2o_cpu/results/h2o_cpu_profile_qwen1_5b

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
from specfill.backends.torch_cuda.kernels.inter import inter_attention_twin
from specfill.backends.torch_cuda.kernels.intra import intra_attention_twin
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core import H2OConfig
from specfill.core import h2o_walk
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
    tail = h2o_walk.dense_tail_attention

    def tail_timed(*args, **kwargs):
        ops.prefix = "tail:"
        try:
            return tail(*args, **kwargs)
        finally:
            ops.prefix = ""
    h2o_walk.dense_tail_attention = tail_timed
    best_full, best_h2o, best_stages = float("inf"), float("inf"), {}
    try:
        for attempt in range(repeats + 1):  # the first is a warm-up
            started = time.perf_counter()
            full_attention(q, k, v, scale)
            full = time.perf_counter() - started
            ops.seconds.clear()
            started = time.perf_counter()
            h2o_walk.h2o_attention_layer(ops, q, k, v, config, scale)
            total = time.perf_counter() - started
            if attempt:
                best_full = min(best_full, full)
                if total < best_h2o:
                    best_h2o, best_stages = total, dict(ops.seconds)
    finally:
        h2o_walk.dense_tail_attention = tail
    best_stages["walk (rest)"] = best_h2o - sum(best_stages.values())
    work_full = h2o.full_dot_products(n)
    work_h2o = h2o.h2o_dot_products(n, config.chunk_size, config.local + config.heavy, config.dense_tail)
    return {"tokens": n, "dtype": str(dtype).split(".")[-1], "full_s": best_full, "h2o_s": best_h2o,
            "speedup": best_full / best_h2o, "work_ratio": work_h2o / work_full,
            "rate_vs_sdpa": (work_h2o / best_h2o) / (work_full / best_full), "stages_s": best_stages}


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def flash_then_colsum(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> None:
    """The alternative to a twin: torch's CPU flash kernel for the output and its log-sum-exp,
    then the column sums from logits recomputed (one more QK^T GEMM) against that log-sum-exp."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    _, lse = flash(q[None], k[None], v[None], 0.0, causal, scale=scale)
    n_kv, group, n_q, n_k = k.shape[0], q.shape[0] // k.shape[0], q.shape[1], k.shape[1]
    rows = (q.float() * scale).reshape(n_kv, group * n_q, -1)
    colsum = torch.zeros(n_kv, group, n_k)
    keys_t = k.float().transpose(1, 2)
    for lo in range(0, n_q, 128):
        hi = min(lo + 128, n_q)
        seen = hi if causal else n_k  # a causal block's rows see no key after its last row
        part = rows.view(n_kv, group, n_q, -1)[:, :, lo:hi].reshape(n_kv, -1, q.shape[2]) @ keys_t[:, :, :seen]
        part = part.view(n_kv, group, hi - lo, seen)
        if causal:
            part.masked_fill_(torch.ones(hi - lo, hi, dtype=torch.bool).triu_(lo + 1), -float("inf"))
        colsum[..., :seen] += part.sub_(lse[0].view(n_kv, group, n_q)[:, :, lo:hi, None]).exp_().sum(dim=2)


def alternatives(shape: tuple[int, int, int], dtype: torch.dtype, repeats: int) -> dict:
    """Each stage's twin against what could replace it, on one chunk (S = 1024, M = 512), plus
    the batched GEMM rate of this dtype: the measurements behind keeping or replacing a twin."""
    heads, kv_heads, dim = shape
    scale = dim ** -0.5
    q = torch.randn(1024, heads, dim).transpose(0, 1).to(dtype)
    k, v, k_mem, v_mem = (torch.randn(kv_heads, n, dim).to(dtype) for n in (1024, 1024, 512, 512))
    keys = torch.randn(kv_heads, 8192, dim).to(dtype)
    ops = TorchOps(torch.device("cpu"), dtype, use_kernels=False)
    a, b = torch.randn(kv_heads, 192, dim).to(dtype), torch.randn(kv_heads, dim, 1024).to(dtype)
    gemm = _best(lambda: a @ b, repeats)
    return {
        "dtype": str(dtype).split(".")[-1], "bmm_gflops": 2 * a.numel() * 1024 / gemm / 1e9,
        "phase1_twin_s": _best(lambda: intra_attention_twin(q, k, v, 1024, scale), repeats),
        "phase1_flash_plus_colsum_s": _best(lambda: flash_then_colsum(q, k, v, scale, True), repeats),
        "phase2_twin_s": _best(lambda: inter_attention_twin(q, k_mem, v_mem, scale), repeats),
        "phase2_flash_plus_colsum_s": _best(lambda: flash_then_colsum(q, k_mem, v_mem, scale, False), repeats),
        "tail_walk_s": _best(lambda: h2o_walk.dense_tail_attention(ops, q[:, -64:], keys, keys, 8192 - 64, 8192 - 64,
                                                              1024, scale), repeats),
        "tail_sdpa_s": _best(lambda: causal_step(q[None, :, -64:], keys[None], keys[None], scale), repeats)}


def write(rows: list[dict], alts: list[dict], out: Path, title: str, machine: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps({"title": title, "machine": machine, "rows": rows,
                                                    "alternatives": alts}, indent=1))
    lines = [f"# {title}", "", f"Machine: {machine_line(machine)} (shared: other jobs ran; best of the repeats).",
             "", "| dtype | tokens | SDPA full s | H2O s | speed-up | H2O work / full | H2O rate / SDPA rate | "
             "top stages (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["stages_s"].items(), key=lambda kv: -kv[1])[:5])
        lines.append(f"| {r['dtype']} | {r['tokens']} | {r['full_s']:.3f} | {r['h2o_s']:.3f} | {r['speedup']:.2f}x "
                     f"| {r['work_ratio']:.2f} | {r['rate_vs_sdpa']:.2f} | {top} |")
    lines += ["", "Alternatives per stage (one chunk S=1024, memory M=512, dense tail 64 rows x 8,192 keys; s):", "",
              "| dtype | bmm GFLOP/s | phase 1 twin | flash + colsum | phase 2 twin | flash + colsum | "
              "tail walk | tail SDPA |", "|---|---|---|---|---|---|---|---|"]
    for a in alts:
        lines.append(f"| {a['dtype']} | {a['bmm_gflops']:.1f} | {a['phase1_twin_s']:.4f} | "
                     f"{a['phase1_flash_plus_colsum_s']:.4f} | {a['phase2_twin_s']:.4f} | "
                     f"{a['phase2_flash_plus_colsum_s']:.4f} | {a['tail_walk_s']:.4f} | {a['tail_sdpa_s']:.4f} |")
    out.with_name(out.name + ".md").write_text("\n".join(lines) + "\n")
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
    fig.savefig(out.with_name(out.name + ".png"), dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "h2o_cpu_profile"))
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
        alts = [alternatives(SHAPES[args.shape], getattr(torch, dtype), args.repeats) for dtype in args.dtypes]
    machine["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    title = (f"H2O stages vs full prefill (SDPA), one layer, {args.shape} shape {SHAPES[args.shape]}, "
             f"{'/'.join(args.dtypes)}, torch CPU ({machine['cpu'][:30]}), {args.threads} thread(s), "
             f"S={config.chunk_size} L={config.local} H={config.heavy} W={config.dense_tail}")
    write(rows, alts, Path(args.out), title, machine)


if __name__ == "__main__":
    main()
