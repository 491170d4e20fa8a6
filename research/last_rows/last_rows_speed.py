"""The last layer's rows (core/ops.last_rows) on the pair: full prefill of the 1.5B and the 0.5B
speculator's pass, each with the last layer computing only the rows read ("rows") and every row
("all": last_rows patched to 0), alternated in one process, float32 on the torch backend.

    .venv/bin/python research/last_rows/last_rows_speed.py [--tokens 2048] [--pairs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from specfill import api
from specfill.backends.torch_cuda import model as torch_model
from specfill.core.methods.prefill import prefill
from specfill.core.methods.specprefill import run_speculator
from specfill.evaluation.ruler_protocol import write_atomic

MODELS = Path.home() / ".cache" / "specfill" / "models"
MAIN = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SPEC = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--step", type=int, default=512)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "last_rows_speed.json")
    args = p.parse_args()
    real = torch_model.last_rows
    ids = np.random.default_rng(0).integers(100, 20000, size=args.tokens)
    result = {
        "cpu": platform.processor() or open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
        "load": os.getloadavg(),
        "tokens": args.tokens,
        "step": args.step,
        "runs": [],
    }
    for name, path in (("full prefill, 1.5B", MAIN), ("speculator pass, 0.5B (query window 32, look-ahead 8)", SPEC)):
        lm, _ = api.load(str(path), backend="cuda", dtype="float32", device="cpu")
        ops, model = lm.ops, lm.model
        for pair in range(args.pairs + 1):  # the first pair warms up
            for mode in ("rows", "all") if pair % 2 == 0 else ("all", "rows"):
                torch_model.last_rows = real if mode == "rows" else (lambda *a: 0)
                began = time.perf_counter()
                if name.startswith("full"):
                    prefill(ops, model, ops.tokens(ids), 0, ops.new_cache(model, len(ids)), step_size=args.step)
                else:
                    run_speculator(
                        ops, model, ids, lookahead=8, stop_ids=frozenset(), step_size=args.step, query_window=32
                    )
                seconds = time.perf_counter() - began
                print(f"{name} pair {pair} {mode}: {seconds:.2f} s", flush=True)
                if pair:
                    result["runs"].append({"what": name, "mode": mode, "seconds": seconds})
        torch_model.last_rows = real
    for name in dict.fromkeys(r["what"] for r in result["runs"]):
        med = {m: statistics.median(r["seconds"] for r in result["runs"] if r["what"] == name and r["mode"] == m)
               for m in ("all", "rows")}  # fmt: skip
        result[name] = {**med, "saved": 1 - med["rows"] / med["all"]}
        print(f"{name}: all rows {med['all']:.2f} s, rows read {med['rows']:.2f} s, saved {result[name]['saved']:.1%}")
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
