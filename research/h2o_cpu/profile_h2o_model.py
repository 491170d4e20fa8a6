"""Where a WHOLE-model prefill spends its time, full vs H2O, torch backend on CPU (issue 26 item 1).

The per-layer profile (research/h2o_cpu/profile_h2o_cpu.py) times attention alone; this one loads a real
model and times one prompt's prefill through `stream_generate` (one token), with wall time added
up per part: the fused q/k/v projection, RoPE, KV cache writes, attention (SDPA for full, the H2O
walk for H2O, with each H2O stage of `TorchOps` apart and the dense tail's share apart), the
output projection, the MLP and the LM head; "rest" is what none of these covers (norms,
residuals, the embedding, the step loop). Same token ids for both methods, one warm-up first;
each prefill step's finishing time is kept too (a run cut short still shows how far it got).

The goals of issue 26 item 1 read off one run: H2O's TTFT over full's, and its FLOP bound
    bound(N) = (T_full - A_full) + A_full * W_h2o / W_full
(full's non-attention time unchanged, plus H2O's own q.k products W_h2o at the rate full's SDPA
achieved, A_full / W_full; W from core/methods/h2o.py, the dense tail counted); attention share
= A_full / T_full. bf16 is not measured: torch bf16 matmul is ~50x slower than fp32 on an
AVX2-only CPU (no AVX-512 / AMX), so it would time the missing hardware, not the method.

    flock /work/model.lock .venv/bin/python research/h2o_cpu/profile_h2o_model.py \\
        ~/.cache/specfill/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --lengths 2048 4096 --threads 2

Writes <out>.json after every prefill, <out>.md and <out>.png (title: model, dtype, device, threads).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from specfill.backends.torch_cuda import model as torch_model
from specfill.backends.torch_cuda import cache as kv_cache
from specfill.core import h2o_walk
from specfill.core.methods import h2o
from specfill.evaluation.machine import describe_machine, machine_line

STAGES = ("intra_attention", "inter_attention", "merge_states", "reduce_colsum_to_kv_heads", "accumulate_scores",
          "build_memory_set", "gather_memory", "concat", "cast_like")
SECONDS: dict[str, float] = defaultdict(float)
PREFIX = [""]
CUT: list[dict] = []  # the prefill under way: recorded as cut short when SIGTERM (timeout) ends the run


def timed(name: str, fn):
    """fn with its wall time added to SECONDS[PREFIX + name] (nested parts are counted in both)."""
    def run(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[PREFIX[0] + name] += time.perf_counter() - started
    return run


def instrument(lm) -> None:
    """Wrap the model's parts and the H2O stages of lm.ops with timers (this process only)."""
    torch_model.causal_attention = timed("attention", torch_model.causal_attention)
    torch_model.apply_rope = timed("rope", torch_model.apply_rope)
    h2o.H2OPrefillAttention.__call__ = timed("attention", h2o.H2OPrefillAttention.__call__)
    tail = h2o_walk.dense_tail_attention

    def tail_timed(*args, **kwargs):
        PREFIX[0] = "tail:"
        try:
            return timed("dense_tail", tail)(*args, **kwargs)
        finally:
            PREFIX[0] = ""
    h2o_walk.dense_tail_attention = tail_timed
    kv_cache.LayerKVCache.update_and_fetch = timed("kv_cache_write", kv_cache.LayerKVCache.update_and_fetch)
    for stage in STAGES:
        setattr(lm.ops, stage, timed("h2o:" + stage, getattr(lm.ops, stage)))
    net = lm.model
    for block in net.layers:
        block.self_attn.qkv_proj.forward = timed("qkv_proj", block.self_attn.qkv_proj.forward)
        block.self_attn.o_proj.forward = timed("o_proj", block.self_attn.o_proj.forward)
        block.mlp.forward = timed("mlp", block.mlp.forward)
    net.lm_head.forward = timed("lm_head", net.lm_head.forward)


def run(lm, tokenizer, ids: list[int], method: str) -> dict:
    from specfill.api import stream_generate
    SECONDS.clear()
    started, cpu = time.perf_counter(), time.process_time()
    steps: list[tuple[int, float]] = []
    CUT[:] = [{"method": method, "tokens": len(ids), "cut": True, "steps": steps, "parts_s": SECONDS}]

    def step(done: int, total: int) -> None:  # printed too: a run cut short still shows its steps
        steps.append((done, round(time.perf_counter() - started, 3)))
        print(f"  {method} {done}/{total} tokens at {steps[-1][1]:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    out = list(stream_generate(lm, tokenizer, ids, 1, method=method, prompt_progress_callback=step))
    total, cpu = time.perf_counter() - started, time.process_time() - cpu
    parts = dict(SECONDS)
    outer = ("qkv_proj", "rope", "kv_cache_write", "attention", "o_proj", "mlp", "lm_head")
    parts["rest"] = total - sum(parts.get(name, 0.0) for name in outer)
    return {"method": method, "tokens": len(ids), "total_s": total, "ttft_s": out[0].ttft, "parts_s": parts,
            "first_token": out[0].token,
            "cpu_s": cpu, "steps": steps, "load_after": round(os.getloadavg()[0], 2)}


def goals(rows: list[dict]) -> list[dict]:
    """Per run pair (the i-th full and i-th H2O prefill of a length): TTFT ratio, the FLOP bound
    (module docstring) and its share, also with H2O's own non-attention time (the MLP's wall time
    drifts by ~10% between identical runs here, which the first bound charges to H2O)."""
    from specfill.core import H2OConfig
    config, found = H2OConfig(), []
    for n in sorted({r["tokens"] for r in rows}):
        done = [r for r in rows if r["tokens"] == n and not r.get("cut")]
        fulls, ours = ([r for r in done if r["method"] == m] for m in ("full", "h2o"))
        for full, mine in zip(fulls, ours):
            attn, h2o_attn = full["parts_s"]["attention"], mine["parts_s"]["attention"]
            work = h2o.h2o_dot_products(n, config.chunk_size, config.memory_size, config.dense_tail) \
                / h2o.full_dot_products(n)
            bound = full["ttft_s"] - attn + attn * work
            own = mine["ttft_s"] - h2o_attn + attn * work
            found.append({"tokens": n, "full_ttft_s": full["ttft_s"], "h2o_ttft_s": mine["ttft_s"],
                          "speedup": full["ttft_s"] / mine["ttft_s"], "attention_share": attn / full["ttft_s"],
                          "work_ratio": work, "bound_s": bound, "of_bound": bound / mine["ttft_s"],
                          "of_own_bound": own / mine["ttft_s"], "attention_speedup": attn / h2o_attn,
                          "attention_rate_vs_sdpa": attn * work / h2o_attn,
                          "cpu_speedup": full["cpu_s"] / mine["cpu_s"] if "cpu_s" in full else None,
                          "same_first_token": None if "first_token" not in full else
                          full["first_token"] == mine.get("first_token")})
    return found


def write(rows: list[dict], out: Path, title: str, machine: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    found = goals(rows)
    out.with_name(out.name + ".json").write_text(json.dumps({"title": title, "machine": machine, "rows": rows,
                                                             "goals": found}, indent=1))
    loads = [r["load_after"] for r in rows]
    lines = [f"# {title}", "", f"Machine: {machine_line(machine)}; load average after each prefill "
             f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} (2 threads of our own: ~2 is a quiet machine; "
             "per prefill in the JSON).", "",
             "| tokens | full TTFT s | H2O TTFT s | H2O speed-up | attention share of full | H2O work / full "
             "| FLOP bound s | H2O at % of bound | same, H2O's own non-attention time | attention speed-up "
             "| H2O attention rate / SDPA's | speed-up in CPU seconds | same first token |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {g['tokens']} | {g['full_ttft_s']:.1f} | {g['h2o_ttft_s']:.1f} | {g['speedup']:.2f}x | "
              f"{g['attention_share']:.0%} | {g['work_ratio']:.3f} | {g['bound_s']:.1f} | {g['of_bound']:.0%} | "
              f"{g.get('of_own_bound', 0):.0%} | {g.get('attention_speedup', 0):.2f}x | "
              f"{g['attention_rate_vs_sdpa']:.2f} | "
              + (f"{g['cpu_speedup']:.2f}x |" if g["cpu_speedup"] else "- |")
              + f" {'-' if g.get('same_first_token') is None else g['same_first_token']} |" for g in found]
    lines += ["", "FLOP bound = (T_full - A_full) + A_full * W_h2o / W_full (A: full's attention seconds, W: q.k "
              "products, dense tail counted). bf16 not measured: torch bf16 matmul is ~50x slower than fp32 on "
              "this AVX2-only CPU.", "", "Seconds per part of one whole prefill (nested: h2o:* and tail:* are "
              "inside attention).", ""]
    for n in sorted({r["tokens"] for r in rows}):
        pair = [r for r in rows if r["tokens"] == n]
        names = sorted({k for r in pair for k in r["parts_s"]})
        lines += [f"## {n} tokens", "", "| part | " + " | ".join(r["method"] + (" (cut short)" if r.get("cut") else "")
                                                                for r in pair) + " |", "|---|" + "---|" * len(pair)]
        lines.append("| total | " + " | ".join(f"{r.get('total_s', r['steps'][-1][1] if r['steps'] else 0.0):.2f}"
                                                for r in pair) + " |")
        lines.append("| steps done (tokens at s) | " + " | ".join(", ".join(f"{d} at {t:.0f}" for d, t in r["steps"])
                                                                  for r in pair) + " |")
        for name in names:
            lines.append(f"| {name} | " + " | ".join(f"{r['parts_s'].get(name, 0.0):.2f}" for r in pair) + " |")
        lines.append("")
    out.with_name(out.name + ".md").write_text("\n".join(lines))
    plot(rows, out, title)


def plot(rows: list[dict], out: Path, title: str) -> None:
    """Stacked seconds per outer part, full and H2O side by side per length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = ("mlp", "qkv_proj", "o_proj", "attention", "rope", "kv_cache_write", "lm_head", "rest")
    fig, ax = plt.subplots(figsize=(9, 5))
    labels = [f"{r['tokens']}\n{r['method']}" + (" (cut)" if r.get("cut") else "") for r in rows]
    bottom = [0.0] * len(rows)
    for part in parts:
        values = [max(0.0, r["parts_s"].get(part, 0.0)) for r in rows]
        ax.bar(range(len(rows)), values, 0.6, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("seconds (whole prefill)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.with_name(out.name + ".png"), dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=["full", "h2o"])
    parser.add_argument("--alternate", action="store_true", help="reverse the method order every other length")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "h2o_model_profile"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` cuts the run: write what it has
    from specfill.api import load
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))  # research/peers/peer_table.py
    from peer_table import prompt_ids
    lm, tokenizer = load(args.gguf, backend="cuda", dtype="float32", device="cpu")
    instrument(lm)
    machine = describe_machine({"load_average_1min_before": round(os.getloadavg()[0], 2),
                                "torch_threads": torch.get_num_threads()})
    title = f"Whole-model prefill by part, {Path(args.gguf).name}, float32, torch CPU, {args.threads} threads"
    run(lm, tokenizer, prompt_ids(args.gguf, 256), "full")  # warm-up
    rows = []
    for index, n in enumerate(args.lengths):
        ids = prompt_ids(args.gguf, n)
        for method in args.methods[::-1] if args.alternate and index % 2 else args.methods:
            try:
                rows.append(run(lm, tokenizer, ids, method))
            except KeyboardInterrupt:  # SIGTERM (`timeout`): keep what the cut prefill did
                rows.append({**CUT[0], "parts_s": dict(SECONDS), "load_after": round(os.getloadavg()[0], 2)})
                write(rows, Path(args.out), title, machine)
                raise SystemExit(f"cut short during {method} at {n} tokens; partial rows written")
            r = rows[-1]
            print(f"{n} {method}: {r['total_s']:.2f} s " + ", ".join(f"{k} {v:.2f}" for k, v in
                  sorted(r["parts_s"].items(), key=lambda kv: -kv[1])[:12]), flush=True)
            machine["load_average_1min_after"] = r["load_after"]
            write(rows, Path(args.out), title, machine)


if __name__ == "__main__":
    main()
