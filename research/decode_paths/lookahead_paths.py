"""Does SpecPrefill's look-ahead as static steps (what a GPU replays as CUDA graphs, TorchOps.capture_step)
choose what the eager look-ahead chooses, on a real speculator?

On a GPU the look-ahead's steps are static decode steps keeping the scored layers' queries
(decode_graph.DecodeGraphs.run_keeping; a nested speculator's deeper layers in slots of their own); on the CPU
they run layer by layer. Here Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, dequantized) reads a real prompt and
core/methods/specprefill.speculate_and_select runs once each way, eager (ops.static_decode False) and
static (DecodeGraphs(None): the static steps, run eagerly), for SpecPrefill's default, auto's turn
composition (an H2O speculator, nested) and auto's composition. Compared: the look-ahead tokens, the kept
positions, the chunk scores.

    .venv/bin/python research/decode_paths/lookahead_paths.py [--dtype bfloat16] [--prompt-tokens 4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from decode_paths import MODELS, prompt_ids, set_mode

from specfill import api
from specfill.core.config import AUTO_COMPOSITION, AUTO_TURN_COMPOSITION, SpecPrefillConfig
from specfill.core.methods.specprefill import speculate_and_select
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_protocol import write_atomic

SPEC = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
CONFIGS = {
    "specprefill": SpecPrefillConfig(),
    "turn composition": AUTO_TURN_COMPOSITION,
    "composition": AUTO_COMPOSITION,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--prompt-tokens", type=int, default=4096)
    p.add_argument("--step", type=int, default=512)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    out = args.out or Path(__file__).with_name("results") / f"lookahead_paths_{args.dtype}.json"
    result = {"model": SPEC.name, "dtype": args.dtype, "machine": describe_machine(), "configs": {}}
    lm, tokenizer = api.load(str(SPEC), backend="cuda", dtype=args.dtype, device="cpu")
    ops, model = lm.ops, lm.model
    ids = np.array(prompt_ids(tokenizer, args.prompt_tokens))
    result["prompt_tokens"] = len(ids)
    for name, config in CONFIGS.items():
        runs = {}
        for mode in ("eager", "static"):
            set_mode(ops, mode)
            with ops.device_scope():
                spec, selection, seconds = speculate_and_select(
                    ops, model, ids, config, stop_ids=frozenset(), speculator_step_size=args.step
                )
            runs[mode] = (spec.lookahead, selection, seconds)
            print(f"{name} {mode}: {seconds}", flush=True)
        (look_e, sel_e, sec_e), (look_s, sel_s, sec_s) = runs["eager"], runs["static"]
        common = len(np.intersect1d(sel_e.kept, sel_s.kept))
        row = {
            "lookahead_tokens": {"eager": look_e, "static": look_s},
            "lookahead_equal": look_e == look_s,
            "kept": {"eager": int(len(sel_e.kept)), "static": int(len(sel_s.kept))},
            "kept_equal": bool(np.array_equal(sel_e.kept, sel_s.kept)),
            "kept_overlap": common / max(len(sel_e.kept), len(sel_s.kept)),
            "chunk_scores_max_rel_difference": float(
                np.abs(sel_e.chunk_scores - sel_s.chunk_scores).max() / np.abs(sel_e.chunk_scores).max()
            ),
            "seconds": {"eager": sec_e, "static": sec_s},
        }
        result["configs"][name] = row
        print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'lookahead_tokens'})}", flush=True)
        write_atomic(out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
