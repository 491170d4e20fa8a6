"""H2O against full prefill on one model of the pair, fresh and over a reused prefix, bf16 on torch CPU,
with an op profile of H2O's turn (study bf16_cpu): where the composition's speculator spends an agent turn.

    .venv/bin/python research/bf16_cpu/h2o_turn_profile.py 0.5b 8192 4096 [profile]   # run alone

Prints full's and H2O's seconds for a fresh prompt of P + N tokens and for N new tokens over P cached
(the cache from a full prefill of the first P), then (with a 4th argument) torch's op table of the turn.
H2O runs in every layer (a speculator's prompt pass: layers="all")."""

import os
import sys
import time

import numpy as np
import torch

from specfill.api import load, stream_generate
from specfill.core.config import H2OConfig
from specfill.core.runtime import GenerationInfo

torch.set_num_threads(2)
M = os.path.expanduser("~/.cache/specfill/models/")
name, P, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lm, tok = load(M + f"qwen2.5-coder-{name}-instruct-q4_k_m.gguf", backend="cuda", dtype="bfloat16", device="cpu")
ids = np.random.default_rng(0).integers(1000, 30000, size=P + N).tolist()
h2o = H2OConfig(layers="all")


def gen(method, prompt, reuse=None, **kw):
    info = GenerationInfo()
    t = time.perf_counter()
    for _ in stream_generate(lm, tok, prompt, max_tokens=1, method=method, prefill_info=info, reuse=reuse, **kw):
        pass
    return time.perf_counter() - t, info


gen("full", ids[:2048])
gen("h2o", ids[:2048], h2o=h2o)
for method in ("full", "h2o"):
    kw = {"h2o": h2o} if method == "h2o" else {}
    s, _ = gen(method, ids[: P + N], **kw)
    print(f"fresh {P + N} {method}: {s:.2f} s", flush=True)
    seed = gen("full", ids[:P])[1]
    s, _ = gen(method, ids, reuse=seed.kv, **kw)
    print(f"turn {N} over {P} {method}: {s:.2f} s", flush=True)
if len(sys.argv) > 4:
    from torch.profiler import ProfilerActivity, profile

    seed = gen("full", ids[:P])[1]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        gen("h2o", ids, reuse=seed.kv, h2o=h2o)
    print(
        p.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=45, max_shapes_column_width=90
        )
    )
