"""`auto` on the pair in bf16 on torch CPU, H2O's stages on the CPU flash kernel (kernels/cpu_flash.py)
against the twins (SPECFILL_KERNELS=off, set per run), interleaved in one process (study bf16_cpu).

    .venv/bin/python research/bf16_cpu/flash_vs_twins.py 16384 auto,auto:twins,auto,auto:twins   # run alone

One JSON line per run: TTFT and the prefill's parts (speculator, selection, main_prefill). The
speculator is passed as a path, so every run's TTFT includes loading it (~7 s: stream_generate loads a
path per call); read the parts.
"""

import json
import os
import sys
import time

import torch

from specfill.api import load, stream_generate
from specfill.core.runtime import GenerationInfo
from specfill.evaluation.texts import tokens_of_length

torch.set_num_threads(2)
M = os.path.expanduser("~/.cache/specfill/models/")
length, order = int(sys.argv[1]), sys.argv[2].split(",")
lm, tok = load(M + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", backend="cuda", dtype="bfloat16", device="cpu")
spec = M + "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
ids = tokens_of_length(tok, length)


def gen(method, **kw):
    info = GenerationInfo()
    t = time.perf_counter()
    for _ in stream_generate(lm, tok, ids, max_tokens=1, method=method, prefill_info=info, **kw):
        pass
    return time.perf_counter() - t, info


gen("auto", speculator=spec)  # warm-up (and auto's calibration, when not cached)
for name in order:
    if name.endswith("twins"):
        os.environ["SPECFILL_KERNELS"] = "off"
    else:
        os.environ.pop("SPECFILL_KERNELS", None)
    method = name.split(":")[0]
    s, info = gen(method, **({"speculator": spec} if method != "full" else {}))
    parts = {k: round(v, 2) for k, v in info.seconds.items()}
    record = {"run": name, "ttft_s": round(s, 2), "ran": info.method, "kept": info.kept_tokens, "parts": parts}
    print(json.dumps(record), flush=True)
