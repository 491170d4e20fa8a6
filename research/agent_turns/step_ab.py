"""Full prefill of one agent turn (CACHED tokens cached, NEW new) alternating prefill steps of 512 (the
server's) and 2,048 tokens (the API's), three rounds, the 1.5B in bfloat16 (study agent_turns): whether the
server's steps make its turns slower on a CPU.

    .venv/bin/python research/agent_turns/step_ab.py CACHED NEW   # run alone
"""
import os
import sys
import time
import numpy as np
import torch
from specfill.api import load, stream_generate
from specfill.core.runtime import GenerationInfo, KVState
torch.set_num_threads(2)
M = os.path.expanduser("~/.cache/specfill/models/")
CACHED, NEW = int(sys.argv[1]), int(sys.argv[2])
lm, tok = load(M + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", backend="cuda", dtype="bfloat16", device="cpu")
ids = np.random.default_rng(0).integers(1000, 30000, size=CACHED + NEW).tolist()
info = GenerationInfo()
for _ in stream_generate(lm, tok, ids[:CACHED], max_tokens=1, prefill_info=info): pass
seed = info.kv.cache
print("load", os.getloadavg(), flush=True)
for r in range(3):
    for step in (512, 2048):
        lm.prefill_step_size = step
        reuse = KVState(seed.copy(CACHED, CACHED + NEW + 64), CACHED)
        t = time.perf_counter()
        for _ in stream_generate(lm, tok, ids, max_tokens=1, reuse=reuse): pass
        print(f"round {r} step {step}: {time.perf_counter() - t:.2f} s", flush=True)
