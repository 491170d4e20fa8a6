"""What the in-step cancellation check (core/ops.py `checkpoint`) costs a prefill that is not cancelled: the
library path (no check installed) against the server's (a check installed; MLX then evaluates a
prefill step layer by layer), on both backends, a random SmolLM2-135M-shaped model in float32 on
the CPU. Runs alternate between the two paths (load drifts on a shared machine); medians.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python research/serve/bench_cancel_check.py --out results/serve
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from specfill import load
from specfill.core.ops import cancellation
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine, machine_line

MODEL = "random:smollm2-135m"


def prefill_seconds(model: Any, ids: list[int], checked: bool) -> float:
    """Seconds to the first token of a full prefill of `ids` (with or without an installed check)."""
    started = time.perf_counter()
    steps = model.generate_step(ids, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(),
                                method=PrefillMethod(), info=GenerationInfo())
    if checked:
        with cancellation(lambda: False):
            next(iter(steps))
    else:
        next(iter(steps))
    return time.perf_counter() - started


def measure(backend: str, tokens: int, step: int, repeats: int, threads: int) -> dict[str, Any]:
    if backend == "cuda":
        import torch
        torch.set_num_threads(threads)
        model, _ = load(MODEL, backend="cuda", device="cpu", dtype="float32")
    else:
        model, _ = load(MODEL, backend="mlx", dtype="float32")
    model.prefill_step_size = step
    ids = [(7 * i) % 40000 + 5 for i in range(tokens)]
    prefill_seconds(model, ids, False)  # warm-up
    times: dict[str, list[float]] = {"plain": [], "checked": []}
    for _ in range(repeats):
        for mode in ("plain", "checked"):
            times[mode].append(prefill_seconds(model, ids, mode == "checked"))
    plain, checked = statistics.median(times["plain"]), statistics.median(times["checked"])
    return {"backend": backend, "tokens": tokens, "step": step, "repeats": repeats,
            "plain_s": round(plain, 4), "checked_s": round(checked, 4),
            "checked_over_plain": round(checked / plain, 3), "times": times, "load": round(os.getloadavg()[0], 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--step", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backends", default="mlx,cuda")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    load_before = round(os.getloadavg()[0], 2)
    rows = [measure(b, args.tokens, args.step, args.repeats, args.threads) for b in args.backends.split(",")]
    report = {"model": MODEL, "machine": describe_machine(), "load_before": load_before,
              "load_after": round(os.getloadavg()[0], 2), "rows": rows,
              "command": f"python research/serve/bench_cancel_check.py --tokens {args.tokens} --step {args.step} "
                         f"--repeats {args.repeats} --threads {args.threads} --backends {args.backends}"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cancel_check.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["# The in-step cancellation check on a prefill that is not cancelled", "",
             f"Model: {MODEL} (random weights, float32), CPU. Machine: {machine_line(report['machine'])}. "
             f"Shared machine: load average {load_before} before, {report['load_after']} after; not quiet-machine "
             f"figures. Command: `{report['command']}` (MLX with LD_PRELOAD=libopenblas).", "",
             "| backend | prompt tokens | step | no check (s, median) | check installed (s, median) | ratio | load |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['tokens']} | {r['step']} | {r['plain_s']} | {r['checked_s']} | "
              f"{r['checked_over_plain']} | {r['load']} |" for r in rows]
    lines += ["", "No check installed (the library, the CLI): one context-variable read per layer. A check "
              "installed (the server): torch reads it before every layer; MLX also evaluates each layer of a "
              "step of 32 tokens or more before reading it (decode steps keep their pipelining).", ""]
    (out / "cancel_check.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
