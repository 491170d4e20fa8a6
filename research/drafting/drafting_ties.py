"""Where speculative decoding's greedy text leaves plain greedy decoding, and how far apart the
plain run's top two logits were there.

A verify pass scores k + 1 tokens in one matmul, plain decoding one; CPU GEMM kernels accumulate
in a different order for different row counts (neither fp32 nor bf16 is batch-invariant), so the
two runs' logits differ by rounding. Greedy texts can then differ only where the top two logits
are within that rounding: in bf16 (8-bit mantissa, an ulp of 0.125 at logits of 16-32) exact ties
are common. This script records, per k, the first differing token and the plain run's top-2
margin there.

    python research/drafting/drafting_ties.py --model MAIN.gguf --speculator DRAFT.gguf --dtype bfloat16 \
        --prompt-file results/drafting/code_prompt.txt --out research/drafting/results/drafting_ties_bf16.md
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from specfill.api import load, load_speculator, prefill_method, stream_generate
from specfill.evaluation.machine import describe_machine, machine_line


def plain_with_margins(model, tokenizer, ids, method, max_tokens: int) -> tuple[list[int], list[float]]:
    """Plain greedy decode, recording each step's top-1 minus top-2 logit (greedy's argmax,
    ModelOps.argmax, sees every step's logits)."""
    margins: list[float] = []
    ops, argmax = model.ops, model.ops.argmax

    def recording(logits):
        top = np.sort(ops.to_numpy(logits).astype(np.float64).ravel())[-2:]
        margins.append(float(top[1] - top[0]))
        return argmax(logits)

    ops.argmax = recording  # an instance attribute over the method (greedy's argmax), removed below
    try:
        tokens = [r.token for r in stream_generate(model, tokenizer, ids, max_tokens, method=method)]
    finally:
        del ops.argmax
    return tokens, margins


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--speculator", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt-file", required=True)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--draft-tokens", default="2,3,4,6")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    model, tokenizer = load(args.model, backend="cuda", dtype=args.dtype, device="cpu")
    speculator = load_speculator(args.speculator, model, tokenizer, args.dtype, "cpu")
    ids = tokenizer.encode(Path(args.prompt_file).read_text(encoding="utf-8"))[:args.tokens]
    lines = ["# Speculative decoding vs plain greedy: where the texts part", "",
             f"Machine: {machine_line(describe_machine({'model_dtype': str(model.dtype)}))}.",
             f"Main {args.model}, speculator / draft {args.speculator}, {args.dtype}, prompt {len(ids)} tokens of "
             f"{args.prompt_file}, {args.max_tokens} new tokens, greedy. Command: `python research/drafting/drafting_ties.py "
             f"--dtype {args.dtype} --draft-tokens {args.draft_tokens} ...`.", "",
             "| prefill | k | first differing token | plain top-2 margin there | smallest plain margin | median |",
             "|---|---|---|---|---|---|"]
    for name in ("full", "specprefill"):
        method = prefill_method(name, speculator=speculator) if name == "specprefill" else prefill_method(name)
        plain, margins = plain_with_margins(model, tokenizer, ids, method, args.max_tokens)
        for k in (int(x) for x in args.draft_tokens.split(",")):
            extra = {"num_draft_tokens": k} if name == "specprefill" else {"num_draft_tokens": k, "draft_model": speculator}
            drafted = [r.token for r in stream_generate(model, tokenizer, ids, args.max_tokens, method=method, **extra)]
            first = next((i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b), None)
            there = "-" if first is None else f"{margins[first]:.4f}"
            lines.append(f"| {name} | {k} | {'none (identical)' if first is None else first} | {there} "
                         f"| {min(margins):.4f} | {np.median(margins):.3f} |")
            print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
