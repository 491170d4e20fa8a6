"""What an idle rebuild step's size costs (specfill/serve/prompt_cache.py COMPLETION_STEP): dense
prefill of `step` more tokens over a cached context, as PromptCache.complete_step runs it
(generate_step with the reused KV, one token sampled), per token and per step, for several step
sizes; torch float32 on the 1.5B. A step's seconds are how long a request arriving mid-step waits.

    .venv/bin/python research/serve/rebuild_step.py [--context 4096] [--steps 32,64,128,256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from specfill import api
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from specfill.evaluation.ruler_protocol import write_atomic

MAIN = Path.home() / ".cache" / "specfill" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def extend(lm, ids: list[int], state: KVState | None) -> tuple[float, GenerationInfo]:
    info = GenerationInfo()
    began = time.perf_counter()
    for _ in lm.generate_step(
        ids, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod("full"),
        info=info, reuse=state,
    ):  # fmt: skip
        pass
    return time.perf_counter() - began, info


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", default="32,64,128,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "rebuild_step.json")
    args = p.parse_args()
    lm, _ = api.load(str(MAIN), backend="cuda", dtype="float32", device="cpu")
    ids = np.random.default_rng(0).integers(100, 20000, size=args.context + 512).tolist()
    seconds, info = extend(lm, ids[: args.context], None)
    print(f"context {args.context}: {seconds:.1f} s", flush=True)
    cache = info.kv.cache
    result = {"load": os.getloadavg(), "context": args.context, "context_s": seconds, "rows": []}
    for step in [int(s) for s in args.steps.split(",")]:
        runs = []
        for _ in range(args.repeats):
            cache.truncate(args.context)
            took, _ = extend(lm, ids[: args.context + step], KVState(cache, args.context))
            runs.append(took)
        med = statistics.median(runs)
        row = {"step": step, "runs_s": runs, "step_s": med, "per_token_ms": 1e3 * med / step}
        result["rows"].append(row)
        print(f"step {step}: {med:.2f} s per step, {row['per_token_ms']:.1f} ms per token", flush=True)
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
