"""What a speculative-decoding verify step costs against a decode step, with and without the
few-row product order (torch CPU; backends/torch_cuda/model.py Linear, ModelOps.verify_scope).

One process, one model: after a prompt prefill, it times interleaved rounds of (a) one decode
step (1 token), (b) a verify step of k + 1 tokens in nn.Linear's order, (c) the same inside
verify_scope(); the cache is trimmed back after each, so every round sees the same context.
Interleaving keeps a shared machine's drifting load out of the ratios. Writes
research/drafting/results/verify_step.{json,md}.

    flock /work/model.lock .venv/bin/python research/drafting/bench_verify_step.py --threads 1
"""
from __future__ import annotations

import argparse
import json
import statistics
from contextlib import nullcontext
import time
from pathlib import Path

import numpy as np
import torch

from specfill.api import load
from specfill.evaluation.machine import describe_machine, machine_line

HERE = Path(__file__).resolve().parent
MAIN = Path.home() / ".cache" / "specfill" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def timed(ops, model, cache, ids: np.ndarray, position: int, scope) -> float:
    """Seconds of one forward of `ids` at `position` (logits for every row), cache trimmed back."""
    start = time.perf_counter()
    with scope:
        out = ops.forward(model, ops.tokens(ids), position, cache, None, 0)
        ops.settle([out])
    seconds = time.perf_counter() - start
    cache.trim(len(ids))
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(MAIN))
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(HERE / "results" / "verify_step"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm, _ = load(args.model, backend="cuda", dtype="float32", device="cpu")
    ops, model = lm.ops, lm.model
    rng = np.random.default_rng(0)
    ids = rng.integers(100, 20000, args.prompt_tokens)
    with ops.device_scope():
        cache = ops.new_cache(model, args.prompt_tokens + args.k + 8)
        ops.forward(model, ops.tokens(ids), 0, cache, None, None)
        times: dict[str, list[float]] = {"decode (1 row)": [], "verify, nn.Linear order": [], "verify, few-row order": []}
        for _ in range(args.rounds + 1):  # the first round warms up and is dropped
            row = ids[:1]
            block = ids[: args.k + 1]
            for name, tokens, scope in (("decode (1 row)", row, nullcontext()),
                                        ("verify, nn.Linear order", block, nullcontext()),
                                        ("verify, few-row order", block, ops.verify_scope())):
                times[name].append(timed(ops, model, cache, tokens, args.prompt_tokens, scope))
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    write(args, medians, times, Path(args.out))


def write(args, medians: dict[str, float], times: dict[str, list[float]], out: Path) -> None:
    machine = describe_machine()
    decode = medians["decode (1 row)"]
    report = {"model": Path(args.model).name, "dtype": "float32", "threads": args.threads, "k": args.k,
              "prompt_tokens": args.prompt_tokens, "machine": machine, "median_s": medians, "times_s": times}
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# Verify step vs decode step: {report['model']}, float32, torch CPU, {args.threads} thread(s)", "",
             f"Machine: {machine_line(machine)}. `research/drafting/bench_verify_step.py`: {args.rounds} interleaved rounds "
             f"after a {args.prompt_tokens}-token prefill, medians; a verify step is k + 1 = {args.k + 1} rows "
             "with logits for each.", "",
             "| step | median (s) | vs a decode step |", "|---|---|---|"]
    lines += [f"| {name} | {seconds:.3f} | {seconds / decode:.2f}x |" for name, seconds in medians.items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
