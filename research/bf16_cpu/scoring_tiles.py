"""SpecPrefill scoring at P keys (study bf16_cpu), paired in one process: the whole-tensor torch ops (before
commit 1249ae3) against the CPU tiles (kernels/scoring._scores_by_tiles, pool_rows), bf16 inputs, 2 threads.

    .venv/bin/python research/bf16_cpu/scoring_tiles.py 32000   # run alone

The 0.5B speculator's shape (24 layers, 14 query heads, 2 KV heads, head dim 64), random queries and keys:
auto's scoring (32-query window and 8 look-ahead queries over every layer) and a nested pass's ranking (64
window queries over its first 12 layers); best of two each, and the largest difference of the importances."""
import sys, time, torch, torch.nn.functional as F
torch.set_num_threads(2)
from specfill.backends.torch_cuda.kernels.scoring import attention_scores_twin
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.methods.scoring import token_importance
from specfill.core.config import SpecPrefillConfig

def old_scores(*args, **kwargs):
    return attention_scores_twin(*args, **kwargs, tiles=False)  # the whole tensor at once, as before


def old_smooth(probs, kernel):
    flat = probs.float().reshape(-1, 1, probs.shape[-1])
    return F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2, count_include_pad=True).reshape(probs.shape)

class Old:
    def __init__(self, ops): self.ops = ops
    def __getattr__(self, name): return getattr(self.ops, name)
    def attention_scores(self, *a, **k): return old_scores(*a, **k)
    def smooth_scores(self, p, k): return old_smooth(p, k)

P = int(sys.argv[1]); nl, Hq, Hkv, D = 24, 14, 2, 64
new = TorchOps(torch.device("cpu"), torch.bfloat16, None); old = Old(new)
g = torch.Generator().manual_seed(0)
k = torch.randn(nl, Hkv, P, D, generator=g).to(torch.bfloat16)
import os; print(os.getloadavg(), flush=True)
for window, label in [(32, "auto's scoring: 32-query window + 8 look-ahead, 24 layers"), (64, "a nested pass's ranking: 64 window queries, first 12 layers")]:
    layers = list(range(24)) if window == 32 else list(range(12))
    nq = window + (8 if window == 32 else 0)
    q = torch.randn(len(layers), nq, Hq, D, generator=g).to(torch.bfloat16)
    cfg = SpecPrefillConfig(query_window=window)
    times = {"old": [], "new": []}
    for rep in range(2):
        for name, ops in (("old", old), ("new", new)):
            t = time.perf_counter()
            imp = token_importance(ops, q, lambda l: k[l:l+1], cfg, D**-0.5, n_window=window, layers=layers)
            times[name].append(time.perf_counter() - t)
            if name == "old": ref = imp
            else: err = float(((imp - ref).abs().max() / ref.abs().max()))
    print(f"P={P} {label}: whole-tensor {min(times['old']):.2f} s, tiles {min(times['new']):.2f} s, max rel diff {err:.1e}", flush=True)
