"""The composition end to end (AUTO_COMPOSITION, the 1.5B with the 0.5B speculator), this code's
last-row savings on ("rows") against off ("all": last_rows patched to 0 and the speculator's last
layer walked, as before 2026-11-30), alternated in one process: TTFT and kept tokens, torch float32.

    .venv/bin/python research/last_rows/composition_ab.py [--tokens 8192] [--pairs 2] [--out FILE]
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
from specfill.backends.torch_cuda import model as torch_model
from specfill.core.config import AUTO_COMPOSITION
from specfill.core.methods import h2o as h2o_module
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.ruler_protocol import write_atomic

MODELS = Path.home() / ".cache" / "specfill" / "models"


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
    method = PrefillMethod("specprefill", speculator=spec, specprefill=AUTO_COMPOSITION)
    rows, walked = torch_model.last_rows, h2o_module.H2OPrefillAttention.last_row_dense
    result = {"load": os.getloadavg(), "tokens": args.tokens, "runs": []}
    for pair in range(args.pairs + 1):  # the first pair warms up
        for mode in ("rows", "all") if pair % 2 == 0 else ("all", "rows"):
            torch_model.last_rows = rows if mode == "rows" else (lambda *a: 0)
            h2o_module.H2OPrefillAttention.last_row_dense = walked if mode == "rows" else (lambda self, layer: False)
            info, began = GenerationInfo(), time.perf_counter()
            steps = lm.generate_step(
                ids, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(), method=method, info=info
            )
            next(steps)  # the first token: the time to it
            ttft = time.perf_counter() - began
            print(f"pair {pair} {mode}: TTFT {ttft:.2f} s, kept {info.kept_tokens}, parts {info.seconds}", flush=True)
            if pair:
                run = {"mode": mode, "ttft_s": ttft, "kept": info.kept_tokens, "parts_s": dict(info.seconds)}
                result["runs"].append(run)
    torch_model.last_rows, h2o_module.H2OPrefillAttention.last_row_dense = rows, walked
    med = {m: statistics.median(r["ttft_s"] for r in result["runs"] if r["mode"] == m) for m in ("all", "rows")}
    result.update(median_ttft_s=med, saved=1 - med["rows"] / med["all"])
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
