"""One agent turn's prefill, paired in one process: full against SpecPrefill settings, each from the same
cached conversation (the main model's dense KV and the speculator's, as the server keeps them), the
prefill's parts as the driver reports them (study agent_turns, issue 46 line 1).

    .venv/bin/python research/agent_turns/turn_parts.py CACHED NEW [ROUNDS] [ARMS] [STEP]   # run alone

The pair (Qwen2.5-Coder 1.5B + 0.5B, Q4_K_M), bfloat16, 2 threads. Token ids are random (timings do not
depend on the text; keep counts follow the keep rule). The arms run in turn, ROUNDS times (default 2),
so that a drift of the machine hits every arm alike; each line prints as it ends. ARMS: comma list of
full, specprefill, nested, turncomp, turncomp_nested, autocomp (core/config.AUTO_COMPOSITION; default all).
STEP: tokens per prefill step of both models (default the API's 2048; `specfill serve` steps by 512)."""

import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch

from specfill.api import load, load_speculator, stream_generate
from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, KVState
from specfill.serve.speculator_kv import extend_speculator_kv

torch.set_num_threads(2)
M = os.path.expanduser("~/.cache/specfill/models/")
CACHED, NEW = int(sys.argv[1]), int(sys.argv[2])
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
ARMS = {
    "full": None,
    "specprefill": SpecPrefillConfig(),
    "nested": SpecPrefillConfig(deep_keep=0.3, deep_from=0.5),
    "turncomp": SpecPrefillConfig(speculator_prefill="h2o", query_window=32),
    "turncomp_nested": SpecPrefillConfig(speculator_prefill="h2o", query_window=32, deep_keep=0.3, deep_from=0.5),
    "autocomp": AUTO_COMPOSITION,
}
if len(sys.argv) > 4:
    ARMS = {name: ARMS[name] for name in sys.argv[4].split(",")}

flags = subprocess.run(
    "grep -o -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\\n' ' '", shell=True, capture_output=True, text=True
).stdout
print(f"{platform.processor() or platform.machine()} [{flags.strip()}] uptime: {os.getloadavg()}", flush=True)
lm, tok = load(M + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", backend="cuda", dtype="bfloat16", device="cpu")
spec = load_speculator(M + "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", lm, tok, "bfloat16", "cpu")
if len(sys.argv) > 5:
    lm.prefill_step_size = spec.prefill_step_size = int(sys.argv[5])
print(f"prefill steps: {lm.prefill_step_size} (main), {spec.prefill_step_size} (speculator)", flush=True)
ids = np.random.default_rng(0).integers(1000, 30000, size=CACHED + NEW).tolist()


def seed() -> tuple:
    """The conversation's caches as the server holds them: the main model's dense KV of the first
    CACHED tokens (room for the turn), the speculator's beside it."""
    info = GenerationInfo()
    for _ in stream_generate(lm, tok, ids[:CACHED], max_tokens=1, prefill_info=info):
        pass
    return info.kv.cache, extend_speculator_kv(lm, spec, ids[:CACHED], None, CACHED).cache


def turn(config: SpecPrefillConfig | None) -> tuple[float, GenerationInfo]:
    """The turn from copies of the seeded caches (with room for the turn), as the server's cache hands out."""
    main, speculator = (cache.copy(CACHED, CACHED + NEW + 64) for cache in CACHES)
    reuse = KVState(main, CACHED, speculator=KVState(speculator, CACHED))
    info = GenerationInfo()
    kw = {} if config is None else {"method": "specprefill", "specprefill": config, "speculator": spec}
    t = time.perf_counter()
    for _ in stream_generate(lm, tok, ids, max_tokens=1, prefill_info=info, reuse=reuse, **kw):
        pass
    return time.perf_counter() - t, info


CACHES = seed()
turn(None)  # warm-up (and the first seed's allocations)
print(f"turn: {NEW} new over {CACHED} cached", flush=True)
for r in range(ROUNDS):
    for name, config in ARMS.items():
        seconds, info = turn(config)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in (info.seconds or {}).items())
        kept = len(info.kept_positions) if info.kept_positions is not None else CACHED + NEW
        print(f"round {r} {name}: {seconds:.2f} s, kept {kept} [{parts}]", flush=True)
