"""The pair's projections in bfloat16 on a CPU: torch's F.linear (what the model runs) against the same
product with oneDNN's prepacked weight (`mkldnn._reorder_linear_weight` + `mkldnn._linear_pointwise`, what
inductor's CPU freezing uses) and against gate and up fused into one weight (study bf16_cpu).

    .venv/bin/python research/bf16_cpu/linear_prepack.py [ROWS]   # run alone; ROWS default 2048

Interleaved rounds (each variant once per round, best of ROUNDS) so that the VM's drift hits all alike;
prints GFLOP/s per shape and variant, and the largest difference from F.linear's output."""

import os
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
ROUNDS = 5
SHAPES = {  # (in, out) of each projection, the pair's (Qwen2.5-Coder 0.5B, 1.5B)
    "0.5b q": (896, 896),
    "0.5b gate": (896, 4864),
    "0.5b gate+up": (896, 9728),
    "0.5b down": (4864, 896),
    "1.5b q": (1536, 1536),
    "1.5b gate": (1536, 8960),
    "1.5b gate+up": (1536, 17920),
    "1.5b down": (8960, 1536),
}
print(f"load {os.getloadavg()}, rows {ROWS}, bf16, 2 threads", flush=True)
gen = torch.Generator().manual_seed(0)
for name, (k, n) in SHAPES.items():
    x = torch.randn(ROWS, k, generator=gen).bfloat16()
    w = (torch.randn(n, k, generator=gen) / k**0.5).bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, ROWS)
    runs = {
        "F.linear": lambda: F.linear(x, w),
        "prepacked": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
    }
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(ROUNDS):
        for label, run in runs.items():
            t = time.perf_counter()
            run()
            best[label] = min(best[label], time.perf_counter() - t)
    diff = (runs["prepacked"]().float() - runs["F.linear"]().float()).abs().max().item()
    flops = 2 * ROWS * k * n
    rates = ", ".join(f"{label} {flops / s / 1e9:.0f} GFLOP/s ({s * 1e3:.1f} ms)" for label, s in best.items())
    print(f"{name} [{ROWS}x{k}]@[{k}x{n}]: {rates}; max |diff| {diff:.3g}", flush=True)
