"""H2O vs full prefill on CPU: per-layer attention and end-to-end TTFT, in one run.

Per layer: SmolLM2-135M attention shapes (9 query / 3 KV heads, head dim 64), random post-RoPE
q/k/v in the model's layout; torch's fused causal SDPA over the whole prompt against
`h2o_attention_layer` with the torch twins. End to end: the demo GGUF, `stream_generate` with
method "full" and "h2o", alternating so load drift hits both. Each figure is the best of
`--repeats`; CPU seconds (process time) are printed beside wall seconds because other jobs share
the cores: with one thread they measure the work, not the wait.

    python research/h2o_cpu/bench_h2o_cpu.py                      # both parts, 1 thread and the default
    python research/h2o_cpu/bench_h2o_cpu.py --part layer --lengths 4096 8192
    python research/h2o_cpu/bench_h2o_cpu.py --threads 1 --lengths 8000 --dense-tail 64   # + the tail's cost

With --dense-tail W > 0 a third variant, H2O with the dense tail, is timed beside H2O without it.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F

from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.h2o_walk import h2o_attention_layer
from specfill.core import H2OConfig

CONFIG = H2OConfig(1024, 4096, 256, 256, dense_tail=0)  # (S, B, L, H) of issue #4, no dense tail
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best (wall, CPU) seconds of `repeats` calls after one warm-up call."""
    fn()
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return best_wall, best_cpu


TWINS = TorchOps(torch.device("cpu"), torch.float32, use_kernels=False)


def variants(config: H2OConfig, tail: int) -> dict[str, H2OConfig]:
    """"h2o" (config as given) and, for tail > 0, "h2o+tail" (the same with dense tail W=tail)."""
    return {"h2o": config, **({"h2o+tail": dataclasses.replace(config, dense_tail=tail)} if tail else {})}


def layer_rows(lengths: list[int], repeats: int, config: H2OConfig, tail: int = 0) -> list[dict]:
    rows = []
    scale = HEAD_DIM ** -0.5
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        # the model hands over [T, H, D] projections viewed as [H, T, D]
        q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).transpose(0, 1)
        k, v = (torch.randn(KV_HEADS, n, HEAD_DIM, generator=gen) for _ in range(2))
        full = timed(lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                                            scale=scale, enable_gqa=True), repeats)
        timings = {name: timed(lambda c=c: h2o_attention_layer(TWINS, q, k, v, c, scale), repeats)
                   for name, c in variants(config, tail).items()}
        rows.append({"tokens": n, "full": full, **timings})
    return rows


def e2e_rows(lengths: list[int], repeats: int, config: H2OConfig, tail: int = 0) -> list[dict]:
    from specfill import load, stream_generate
    from specfill.evaluation.texts import tokens_of_length

    model, tokenizer = load(backend="cuda", device="cpu")

    configs = variants(config, tail)

    def ttft(ids: list[int], name: str) -> tuple[float, float]:
        cpu = time.process_time()
        last = None
        method = "full" if name == "full" else "h2o"
        for last in stream_generate(model, tokenizer, ids, 1, method=method, h2o=configs.get(name)):
            pass
        return last.ttft, time.process_time() - cpu

    warm = tokens_of_length(tokenizer, 1100)
    for name in ("full", *configs):
        ttft(warm, name)
    rows = []
    for n in lengths:
        ids = tokens_of_length(tokenizer, n)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in ("full", *configs)}
        for _ in range(repeats):
            for name in runs:
                runs[name].append(ttft(ids, name))
        rows.append({"tokens": n, **{m: (min(r[0] for r in rs), min(r[1] for r in rs)) for m, rs in runs.items()}})
    return rows


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("| tokens | full wall s | H2O wall s | speed-up (wall) | full CPU s | H2O CPU s | speed-up (CPU) |"
          + (" H2O+tail CPU s | tail cost (CPU) |" if "h2o+tail" in rows[0] else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|" if "h2o+tail" in rows[0] else ""))
    for r in rows:
        (fw, fc), (hw, hc) = r["full"], r["h2o"]
        tail = ""
        if "h2o+tail" in r:
            tc = r["h2o+tail"][1]
            tail = f" {tc:.3f} | {100 * (tc / hc - 1):+.1f}% |"
        print(f"| {r['tokens']} | {fw:.3f} | {hw:.3f} | {fw / hw:.2f}x | {fc:.3f} | {hc:.3f} | {fc / hc:.2f}x |" + tail)


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("layer", "e2e", "both"), default="both")
    parser.add_argument("--lengths", type=int, nargs="+", help="prompt tokens (default: 2000 4000 8000)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="0 = torch's default")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dense-tail", type=int, default=0, help="also time H2O with this dense tail W")
    args = parser.parse_args()
    lengths = args.lengths or [2000, 4000, 8000]
    default_threads = torch.get_num_threads()
    for threads in args.threads:
        torch.set_num_threads(threads or default_threads)
        label = f"{torch.get_num_threads()} thread(s), torch {torch.__version__}"
        print(f"\n## {label}; {load_line()}")
        if args.part in ("layer", "both"):
            print_rows("Per layer (attention only, SmolLM2 shapes, random q/k/v)",
                       layer_rows(lengths, args.repeats, CONFIG, args.dense_tail))
        if args.part in ("e2e", "both"):
            print_rows("End to end TTFT (demo SmolLM2-135M, fp32)", e2e_rows(lengths, args.repeats, CONFIG, args.dense_tail))
        print(f"({load_line()} after)")


if __name__ == "__main__":
    main()
