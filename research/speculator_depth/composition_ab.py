"""The composition end to end (the 1.5B with the 0.5B speculator, torch float32): `auto`'s
composition ("whole": AUTO_COMPOSITION, every speculator layer scored, 8 look-ahead tokens) against
the same selection scored by the speculator's first 14 layers with no look-ahead ("first": its pass
runs those 14 layers only, core/methods/specprefill.pass_depth), alternated in one process: TTFT,
each part and the kept tokens.

    .venv/bin/python research/speculator_depth/composition_ab.py [--tokens 8192] [--pairs 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from specfill import api
from specfill.core.config import AUTO_COMPOSITION
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_protocol import write_atomic

MODELS = Path.home() / ".cache" / "specfill" / "models"
CONFIGS = {"first": dataclasses.replace(AUTO_COMPOSITION, layers="first-14", lookahead=0), "whole": AUTO_COMPOSITION}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "composition_ab.json")
    args = p.parse_args()
    lm, spec = (
        api.load(str(MODELS / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf"), backend="cuda", dtype="float32")[0]
        for size in ("1.5b", "0.5b")
    )
    ids = np.random.default_rng(0).integers(100, 20000, size=args.tokens).tolist()
    result = {
        "machine": describe_machine(),
        "load": os.getloadavg(),
        "tokens": args.tokens,
        "configs": {k: repr(v) for k, v in CONFIGS.items()},
        "runs": [],
    }
    for pair in range(args.pairs + 1):  # the first pair warms up
        for mode in ("first", "whole") if pair % 2 == 0 else ("whole", "first"):
            method = PrefillMethod("specprefill", speculator=spec, specprefill=CONFIGS[mode])
            info, began = GenerationInfo(), time.perf_counter()
            steps = lm.generate_step(
                ids, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(), method=method, info=info
            )
            next(steps)  # the first token: the time to it
            ttft = time.perf_counter() - began
            print(f"pair {pair} {mode}: TTFT {ttft:.2f} s, kept {info.kept_tokens}, parts {info.seconds}", flush=True)
            if pair:
                result["runs"].append(
                    {"mode": mode, "ttft_s": ttft, "kept": info.kept_tokens, "parts_s": dict(info.seconds)}
                )
    med = {m: statistics.median(r["ttft_s"] for r in result["runs"] if r["mode"] == m) for m in CONFIGS}
    result.update(median_ttft_s=med, speedup=med["whole"] / med["first"])
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "machine")}, indent=1))
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
