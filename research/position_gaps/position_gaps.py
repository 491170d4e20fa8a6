"""Why does SpecPrefill lose answers at long prompts? Kept tokens at their ORIGINAL positions (the
paper's method) against the same kept tokens read densely at positions 0..k-1.

Issue 11 asks whether the loss of SpecPrefill at keep 0.3 on the demo model at 8K comes from long
RoPE position gaps. Per passkey trial (the eval's prompts), this runs SpecPrefill, takes the kept
positions from GenerationInfo, and answers three ways with the same main model: (a) the method itself
(kept tokens at original positions), (b) a full prefill of only the kept token ids (contiguous
positions: no gaps), (c) full prefill of the whole prompt. Also records whether every needle token
was kept, so selection misses and reading misses are told apart.

    python research/position_gaps/position_gaps.py --lengths 8000 --keeps 0.1,0.3 --trials 20 --out results/eval/fidelity
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specfill.api import encode_prompt, load, load_speculator, prefill_method
from specfill.core import SpecPrefillConfig
from specfill.core.runtime import GenerationInfo
from specfill.evaluation.machine import describe_machine, machine_line
from specfill.evaluation.quality import retrieval_prompts, retrieval_trial


def answers(model, tokenizer, prompt, key, method, info=None) -> bool:
    """The eval's own check (12 greedy tokens hold the key); prompt as text or token ids."""
    return retrieval_trial(model, tokenizer, prompt, key, method, GenerationInfo() if info is None else info)[0]


def one_trial(model, tokenizer, speculator, prompt, spans, key, keep) -> dict:
    """The three readings of one prompt at one keep ratio."""
    ids = encode_prompt(tokenizer, prompt)
    info = GenerationInfo()
    method = prefill_method("specprefill", specprefill=SpecPrefillConfig(keep_ratio=keep), speculator=speculator)
    original = answers(model, tokenizer, ids, key, method, info)
    kept = np.asarray(info.kept_positions, dtype=np.int64)
    contiguous = answers(model, tokenizer, [ids[p] for p in kept], key, "full")
    needle = set(range(*spans["needle"]))
    gaps = np.diff(kept)
    return {"key": key, "kept": int(kept.size), "needle_kept": needle <= set(kept.tolist()),
            "needle_kept_fraction": len(needle & set(kept.tolist())) / len(needle),
            "original_positions": original, "contiguous_positions": contiguous,
            "max_gap": int(gaps.max()) if gaps.size else 0, "gaps_over_32": int((gaps > 32).sum())}


def run(args) -> dict:
    model, tokenizer = load(args.model, backend=args.backend, dtype=args.dtype, device=args.device)
    speculator = load_speculator(args.speculator, model, tokenizer, args.dtype, args.device)
    out = {"machine": describe_machine({"model_dtype": str(model.dtype)}), "args": vars(args), "cells": []}
    for length in args.lengths:
        prompts = retrieval_prompts(tokenizer, "passkey", length, args.trials)
        full = [answers(model, tokenizer, prompt, key, "full") for prompt, _, key, _ in prompts]
        for keep in args.keeps:
            trials = [one_trial(model, tokenizer, speculator, prompt, spans, key, keep)
                      for prompt, spans, key, _ in prompts]
            for trial, ok in zip(trials, full):
                trial["full_prompt"] = ok
            out["cells"].append({"tokens": length, "keep": keep, "trials": trials})
            print(summary_row(out["cells"][-1]), flush=True)
    return out


def summary_row(cell: dict) -> str:
    t = cell["trials"]
    count = lambda key: sum(bool(r[key]) for r in t)  # noqa: E731
    kept_needle_ok = sum(r["original_positions"] for r in t if r["needle_kept"])
    return (f"| {cell['tokens']} | {cell['keep']:g} | {len(t)} | {count('full_prompt')} | {count('original_positions')} "
            f"| {count('contiguous_positions')} | {count('needle_kept')} | {kept_needle_ok} "
            f"| {np.mean([r['max_gap'] for r in t]):.0f} |")


def write(result: dict, out_dir: str, name: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# SpecPrefill: kept tokens at original positions vs the same tokens contiguous", "",
             f"Machine: {machine_line(result['machine'])}.", f"Command: `python research/position_gaps/position_gaps.py "
             + " ".join(f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
                        for k, v in result["args"].items() if k not in ("out", "name")) + "`.", "",
             "| tokens | keep | trials | full prompt | kept, original positions (the method) "
             "| kept, contiguous positions | needle fully kept | right when needle kept | mean max gap |",
             "|---|---|---|---|---|---|---|---|---|"] + [summary_row(c) for c in result["cells"]]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--speculator", default="self:8")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[8000])
    p.add_argument("--keeps", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.3])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--name", default="position_gaps_demo")
    args = p.parse_args()
    write(run(args), args.out, args.name)


if __name__ == "__main__":
    main()
