"""The composition's speculator pass (0.5B, H2O in every layer as `auto` runs it, query window 32,
look-ahead 8) with its last layer's walk skipped (its last prompt row in H2O's dense tail: only the
rows read are computed, attending to every key) against the walk (`last_row_dense` patched False:
the code before), alternated in one process, torch float32 on a real-text prompt. Also checks that
both give the same look-ahead tokens and queries (the selection's inputs).

    .venv/bin/python research/last_rows/composition_final_layer.py [--tokens 8192] [--pairs 2] [--out FILE]
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
from specfill.core.config import AUTO_COMPOSITION
from specfill.core.methods import h2o as h2o_module
from specfill.core.methods.specprefill import run_speculator
from specfill.evaluation.ruler_protocol import write_atomic

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path.home() / ".cache" / "specfill" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--step", type=int, default=2048)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "composition_final_layer.json")
    args = p.parse_args()
    lm, tok = api.load(str(SPEC), backend="cuda", dtype="float32", device="cpu")
    text = "\n\n".join(path.read_text() for path in sorted((ROOT / "core").rglob("*.py")))
    ids = np.array(tok.encode(text)[: args.tokens - 16] + tok.encode("\nWhich function selects the kept tokens?"))
    real = h2o_module.H2OPrefillAttention.last_row_dense
    config = AUTO_COMPOSITION
    result = {"load": os.getloadavg(), "tokens": len(ids), "step": args.step, "runs": []}
    passes = {}
    for pair in range(args.pairs + 1):  # the first pair warms up
        for mode in ("skipped", "walked") if pair % 2 == 0 else ("walked", "skipped"):
            h2o_module.H2OPrefillAttention.last_row_dense = real if mode == "skipped" else (lambda self, layer: False)
            began = time.perf_counter()
            done = run_speculator(
                lm.ops,
                lm.model,
                ids,
                lookahead=config.lookahead,
                stop_ids=frozenset(),
                step_size=args.step,
                query_window=config.query_window,
                h2o=config.speculator_prefill,
            )
            seconds = time.perf_counter() - began
            passes[mode] = done
            print(f"pair {pair} {mode}: {seconds:.2f} s", flush=True)
            if pair:
                result["runs"].append({"mode": mode, "seconds": seconds})
    h2o_module.H2OPrefillAttention.last_row_dense = real
    med = {m: statistics.median(r["seconds"] for r in result["runs"] if r["mode"] == m) for m in ("walked", "skipped")}
    q = {m: np.asarray(lm.ops.to_numpy(passes[m].queries), dtype=np.float64) for m in passes}
    result.update(
        median_s=med,
        saved=1 - med["skipped"] / med["walked"],
        lookahead_equal=passes["walked"].lookahead == passes["skipped"].lookahead,
        lookahead=passes["skipped"].lookahead,
        queries_max_abs_diff=float(np.abs(q["walked"] - q["skipped"]).max()),
    )
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
