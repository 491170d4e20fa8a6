"""This CPU's sustained bf16 GEMM rate: one [4096 x 1536] x [1536 x 8960] product (the 1.5B's gate
projection over a 4K prefill step) repeated for 45 s, GFLOP/s of each group of five, 2 threads.

    .venv/bin/python research/speculator_h2o/drift.py   # run alone"""

import time

import torch

torch.set_num_threads(2)
x, w = torch.randn(4096, 1536).bfloat16(), torch.randn(8960, 1536).bfloat16()
end, rates = time.time() + 45, []
while time.time() < end:
    began = time.perf_counter()
    for _ in range(5):
        torch.nn.functional.linear(x, w)
    rates.append(2 * 4096 * 1536 * 8960 / ((time.perf_counter() - began) / 5) / 1e9)
print(" ".join(f"{r:.0f}" for r in rates))
