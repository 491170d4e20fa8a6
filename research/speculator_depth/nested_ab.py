"""The composition end to end with a nested speculator (its first K layers read every prompt
token, H2O as `auto`'s composition; its deeper layers only the share those K layers' window
scores rank first) against `auto`'s composition (AUTO_COMPOSITION) and full prefill, on the
1.5B + 0.5B pair, torch float32, random ids, one process: TTFT of each (to the first greedy
token), the parts, the kept tokens. Arms: "nested" is the product's
(SpecPrefillConfig.deep_keep); "prototype" nested.py's pass, the first K layers' scores,
AUTO_COMPOSITION's selection and the product's prefill of the kept tokens. A warm-up of each arm
at 1K first.

    .venv/bin/python research/speculator_depth/nested_ab.py [--tokens N] [--depth K] [--deep-keep P] [--arms A,B]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specfill import api
from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
from specfill.core.methods.selection import select_tokens
from specfill.core.methods.specprefill import prefill_kept, token_importance
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_protocol import write_atomic

sys.path.insert(0, str(Path(__file__).parent))
from nested import every_row, nested_pass  # noqa: E402

MODELS = Path.home() / ".cache" / "specfill" / "models"


def arm(lm, spec, ids, name: str, depth: int, deep_keep: float) -> dict:
    """TTFT to the first greedy token, the kept tokens and the parts of one arm: "full", "auto"
    (AUTO_COMPOSITION), "nested" (the product's: AUTO_COMPOSITION scored by the first `depth`
    layers, deep_keep) or "prototype" (nested.py's pass, the same scoring and selection)."""
    if name == "prototype":
        return prototype(lm, spec, ids, depth, deep_keep)
    config = {
        "auto": AUTO_COMPOSITION,
        "nested": dataclasses.replace(AUTO_COMPOSITION, layers=f"first-{depth}", deep_keep=deep_keep),
    }
    method = (
        PrefillMethod("full")
        if name == "full"
        else PrefillMethod("specprefill", speculator=spec, specprefill=config[name])
    )
    info, began = GenerationInfo(), time.perf_counter()
    sampling = SamplingConfig()
    next(lm.generate_step(ids, max_tokens=1, sampling=sampling, stop_ids=frozenset(), method=method, info=info))
    return {"ttft_s": time.perf_counter() - began, "kept": info.kept_tokens, "parts_s": dict(info.seconds)}


def prototype(lm, spec, ids, depth: int, inner_keep: float) -> dict:
    ops, config = lm.ops, AUTO_COMPOSITION
    inner = dataclasses.replace(SpecPrefillConfig(), keep_ratio=inner_keep, lookahead=0)
    began = time.perf_counter()
    with every_row():
        run, head = nested_pass(
            ops, spec.model, np.asarray(ids), depth, inner, config, frozenset(), spec.prefill_step_size
        )
    passed = time.perf_counter()
    with ops.device_scope(), torch.inference_mode():
        window = config.query_window
        importance = token_importance(
            ops,
            run.queries[:, run.n_window - window :],
            run.layer_keys,
            config,
            spec.model.args.attention_scale,
            n_window=window,
            layers=list(range(depth)),
        )
        selection = select_tokens(ops.to_numpy(importance), config)
        selected = time.perf_counter()
        logits, _ = prefill_kept(
            ops, lm.model, np.asarray(ids), selection, extra_slots=1, step_size=lm.prefill_step_size
        )
        int(torch.argmax(logits))
    done = time.perf_counter()
    return {
        "ttft_s": done - began,
        "kept": len(selection.kept),
        "inner": len(head.subset),
        "parts_s": {"speculator": passed - began, "selection": selected - passed, "main_prefill": done - selected},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--deep-keep", type=float, default=0.3)
    p.add_argument("--arms", default="nested,auto,full", help="of full, auto, nested, prototype")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "nested_ab.json")
    args = p.parse_args()
    lm, spec = (
        api.load(str(MODELS / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf"), backend="cuda", dtype="float32")[0]
        for size in ("1.5b", "0.5b")
    )
    arms = args.arms.split(",")
    result = {
        "machine": describe_machine(),
        "load_before": os.getloadavg(),
        "tokens": args.tokens,
        "depth": args.depth,
        "deep_keep": args.deep_keep,
        "composition": repr(AUTO_COMPOSITION),
        "runs": [],
    }

    warm = np.random.default_rng(1).integers(100, 20000, size=1024).tolist()
    for name in arms:
        arm(lm, spec, warm, name, args.depth, args.deep_keep)
    ids = np.random.default_rng(0).integers(100, 20000, size=args.tokens).tolist()
    for name in arms:
        run = {"arm": name, "load": os.getloadavg(), **arm(lm, spec, ids, name, args.depth, args.deep_keep)}
        print(f"{name}: TTFT {run['ttft_s']:.1f} s, kept {run['kept']}, parts {run['parts_s']}", flush=True)
        result["runs"].append(run)
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    ttft = {r["arm"]: r["ttft_s"] for r in result["runs"]}
    if "full" in ttft:
        result["speedup_vs_full"] = {k: ttft["full"] / v for k, v in ttft.items()}
    for name in ("nested", "prototype"):
        if {"auto", name} <= ttft.keys():
            result[f"{name}_vs_auto"] = ttft["auto"] / ttft[name]
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "machine")}, indent=1))
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
