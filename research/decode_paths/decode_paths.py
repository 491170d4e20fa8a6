"""Do the decode paths a GPU user gets give the eager path's greedy tokens on a real model?

Issue 50 item 1 asks for a static-cache decode step (gpt-fast's pattern) whose greedy tokens equal the
eager path's. On a GPU the bench compares them on random weights, whose nearly flat logits part any two
kernels in bf16 after a few tokens; here the real Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, dequantized) on the
CPU takes one prefill of a real prompt and then `--tokens` greedy decode steps three ways, each from a copy
of the same prefilled cache:

- eager: the layer-by-layer path (the CPU's default; ops.static_decode False);
- static: backends/torch_cuda/decode_graph.static_step, the computation CUDA graphs capture, run eagerly
  (DecodeGraphs(None): fixed slot buckets, masked attention, the cache writes through write_slots);
- compiled: that step through torch.compile (inductor, C++ on the CPU; opt-in on a GPU).

For each: the tokens, the first step where they part from eager's (and eager's top-2 logit gap there:
a gap near the dtype's rounding is a tie, not a bug), the max |logit difference| over the steps both
took alike, warm decode tokens/s (the first step, with any compilation, apart).

    .venv/bin/python research/decode_paths/decode_paths.py [--dtype bfloat16] [--prompt-tokens 2048]
        [--tokens 64] [--modes eager,static,compiled] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from specfill import api
from specfill.backends.torch_cuda.decode_graph import DecodeGraphs
from specfill.core.methods.prefill import prefill
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_protocol import write_atomic

MODELS = Path.home() / ".cache" / "specfill" / "models"
MAIN = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
ROOT = Path(__file__).resolve().parents[2]


def prompt_ids(tokenizer, tokens: int) -> list[int]:
    """This repository's core/ sources, a coding agent's kind of prompt, cut to `tokens` ids."""
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "core").glob("*.py")))
    ids = list(tokenizer.encode(text))
    if len(ids) < tokens:
        raise SystemExit(f"error: core/ gives {len(ids)} tokens, fewer than --prompt-tokens {tokens}")
    return ids[:tokens]


def set_mode(ops, mode: str) -> None:
    ops.static_decode = mode != "eager"
    ops.decode_graphs = DecodeGraphs(None, compiled=mode == "compiled") if mode != "eager" else None


def decode(ops, model, cache, first: torch.Tensor, start: int, steps: int) -> dict:
    """Greedy decode from logits `first` at position `start`: tokens, each step's logits, seconds per step."""
    logits, tokens, out, seconds = first, [], [], []
    for i in range(steps):
        token = int(logits.argmax())
        tokens.append(token)
        out.append(logits)
        began = time.perf_counter()
        logits = ops.forward(model, ops.tokens(np.array([token])), start + i, cache, None, 0)[-1].float()
        seconds.append(time.perf_counter() - began)
    return {"tokens": tokens, "logits": out, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--modes", default="eager,static,compiled")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    out = args.out or Path(__file__).with_name("results") / f"decode_paths_{args.dtype}.json"
    result = {"model": MAIN.name, "dtype": args.dtype, "machine": describe_machine(), "runs": {}}
    lm, tokenizer = api.load(str(MAIN), backend="cuda", dtype=args.dtype, device="cpu")
    ops, model = lm.ops, lm.model
    ids = prompt_ids(tokenizer, args.prompt_tokens)
    result["prompt_tokens"] = len(ids)
    with ops.device_scope():
        cache = ops.new_cache(model, len(ids) + args.tokens + 8)
        began = time.perf_counter()
        first = prefill(ops, model, ops.tokens(np.array(ids)), 0, cache, step_size=lm.prefill_step_size)[-1].float()
        result["prefill_seconds"] = time.perf_counter() - began
        print(f"prefill {len(ids)} tokens: {result['prefill_seconds']:.1f} s", flush=True)
        runs = {}
        for mode in args.modes.split(","):
            set_mode(ops, mode)
            runs[mode] = decode(ops, model, cache.copy(cache.filled, cache.capacity), first, len(ids), args.tokens)
            warm = runs[mode]["seconds"][1:]
            row = {
                "tokens": runs[mode]["tokens"],
                "first_step_seconds": runs[mode]["seconds"][0],
                "warm_tokens_per_s": len(warm) / sum(warm),
            }
            if mode != "eager" and "eager" in runs:
                ref = runs["eager"]
                parted = next((i for i, (a, b) in enumerate(zip(row["tokens"], ref["tokens"])) if a != b), None)
                alike = parted if parted is not None else len(ref["tokens"])
                top2 = torch.topk(ref["logits"][parted], 2).values if parted is not None else None
                row |= {
                    "tokens_equal_eager": parted is None,
                    "first_parted_step": parted,
                    "eager_top2_gap_there": None if top2 is None else float(top2[0] - top2[1]),
                    "max_abs_logit_difference": max(
                        float((a - b).abs().max()) for a, b in zip(runs[mode]["logits"][:alike], ref["logits"][:alike])
                    ),
                    "eager_logit_std": float(ref["logits"][0].std()),
                }
            result["runs"][mode] = row
            print(f"{mode}: {json.dumps({k: v for k, v in row.items() if k != 'tokens'})}", flush=True)
            write_atomic(out, json.dumps(result, indent=1) + "\n")
    result["text"] = {mode: tokenizer.decode(r["tokens"]) for mode, r in result["runs"].items()}
    write_atomic(out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
