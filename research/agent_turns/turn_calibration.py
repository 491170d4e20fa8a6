"""What `auto` picks on agent turns from its turn calibrations (core/probe: each option timed over a cached
prefix of TURN_CACHED_PER_NEW x the new tokens), on the pair, bf16, 2 threads (issue 46; run alone).

    .venv/bin/python research/agent_turns/turn_calibration.py CALIBRATION_DIR

CALIBRATION_DIR: where the calibrations are read and written (copy ~/.cache/specfill/calibration there to keep
the fresh-prompt ones). Prints the turn calibrations' points, the time they took, and auto's choice with its
reasons for the agent_turns shapes (2,124 / 4,176 / 8,275 new over 8,559 / 10,688 / 14,869 cached)."""

import json
import os
import platform
import subprocess
import sys
import time

os.environ["SPECFILL_CALIBRATION_DIR"] = sys.argv[1]
import torch  # noqa: E402

from specfill.api import load, load_speculator  # noqa: E402
from specfill.core import probe  # noqa: E402
from specfill.core.crossover import calibration_path  # noqa: E402
from specfill.core.request import build_request  # noqa: E402

torch.set_num_threads(2)
M = os.path.expanduser("~/.cache/specfill/models/")
flags = subprocess.run(
    "grep -o -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\\n' ' '", shell=True, capture_output=True, text=True
).stdout
print(f"{platform.processor() or platform.machine()} [{flags.strip()}] load: {os.getloadavg()}", flush=True)
lm, tok = load(M + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", backend="cuda", dtype="bfloat16", device="cpu")
spec = load_speculator(M + "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", lm, tok, "bfloat16", "cpu")
method = build_request(max_tokens=1, method="auto", speculator=spec).method
for new, cached in ((2124, 8559), (4176, 10688), (8275, 14869)):
    started = time.perf_counter()
    chosen, why = probe.auto_choice(lm, method, new, cached)
    print(f"\n{new} new over {cached} cached: {chosen.name} ({probe.sparse_name(chosen)}) [{time.perf_counter() - started:.1f} s]")
    print("  " + why.replace("; ", "\n  "), flush=True)
for option in probe.auto_options(method, 4176, True, 10688):
    path = calibration_path(probe.key_for(lm, option, True))
    if path.exists():
        data = json.loads(path.read_text())
        points = {n: f"{p['sparse_s'] / p['full_s']:.2f} ({p['full_s']:.1f} s full)" for n, p in data["points"].items()}
        print(f"{probe.sparse_name(option)} turn points (sparse / full): {points}", flush=True)
