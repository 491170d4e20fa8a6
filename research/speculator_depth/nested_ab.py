"""The composition end to end with a nested speculator (nested.py: its first K layers read every
prompt token, H2O as `auto`'s composition; its deeper layers only the subset those K layers'
window scores keep) against `auto`'s composition (AUTO_COMPOSITION, the product) and full
prefill, on the 1.5B + 0.5B pair, torch float32, random ids, one process: TTFT of each (to the
first greedy token), the parts, the kept tokens. The nested arm scores from its first K layers
(window + look-ahead queries) with AUTO_COMPOSITION's selection, then the product's prefill of
the kept tokens (core/methods/specprefill.prefill_kept). A warm-up of each arm at 1K first.

    .venv/bin/python research/speculator_depth/nested_ab.py [--tokens 16384] [--depth 12] [--inner-keep 0.3]
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


def product(lm, spec, ids, name: str) -> dict:
    method = (
        PrefillMethod("full")
        if name == "full"
        else PrefillMethod("specprefill", speculator=spec, specprefill=AUTO_COMPOSITION)
    )
    info, began = GenerationInfo(), time.perf_counter()
    steps = lm.generate_step(
        ids, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(), method=method, info=info
    )
    next(steps)
    return {"ttft_s": time.perf_counter() - began, "kept": info.kept_tokens, "parts_s": dict(info.seconds)}


def nested(lm, spec, ids, depth: int, inner_keep: float) -> dict:
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
    p.add_argument("--inner-keep", type=float, default=0.3)
    p.add_argument("--arms", default="nested,auto,full")
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
        "inner_keep": args.inner_keep,
        "composition": repr(AUTO_COMPOSITION),
        "runs": [],
    }

    def arm(name: str, ids: list[int]) -> dict:
        if name == "nested":
            return nested(lm, spec, ids, args.depth, args.inner_keep)
        return product(lm, spec, ids, name)

    warm = np.random.default_rng(1).integers(100, 20000, size=1024).tolist()
    for name in arms:
        arm(name, warm)
    ids = np.random.default_rng(0).integers(100, 20000, size=args.tokens).tolist()
    for name in arms:
        run = {"arm": name, "load": os.getloadavg(), **arm(name, ids)}
        print(f"{name}: TTFT {run['ttft_s']:.1f} s, kept {run['kept']}, parts {run['parts_s']}", flush=True)
        result["runs"].append(run)
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    ttft = {r["arm"]: r["ttft_s"] for r in result["runs"]}
    if "full" in ttft:
        result["speedup_vs_full"] = {k: ttft["full"] / v for k, v in ttft.items()}
    if {"auto", "nested"} <= ttft.keys():
        result["nested_vs_auto"] = ttft["auto"] / ttft["nested"]
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "machine")}, indent=1))
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
