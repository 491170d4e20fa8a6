"""Speculative decoding with a fixed draft length k against the adaptive one (issue #26 item 5).

Per model configuration and prompt, four greedy generations in one process: plain decoding, drafting
with a fixed k (`Drafting(adaptive=False)`, the schedule before) and the adaptive draft length
(core/methods/draft_length.py, the default now, k <= the same maximum) twice: first with no step
costs remembered for the pair on this machine (its first decode here), then with the costs that run
kept (core/methods/draft_costs.py: a draft model that cannot pay is skipped before its prefill).
The remembered costs go to a temporary folder (SPECFILL_CALIBRATION_DIR), never the user's cache. Reported per run: decode
tokens/s (first to last token, the draft model's prompt prefill included), speed-up against plain
decoding, acceptance, the k of every round (summarised: mean k, share of plain rounds), the step
time spent drafting and verifying, and whether the tokens equal plain decoding's.

    flock /work/model.lock .venv/bin/python research/drafting/bench_drafting_adaptive.py --config pair
    flock /work/model.lock .venv/bin/python research/drafting/bench_drafting_adaptive.py --config demo

Each call replaces its configuration's rows (of the prompts it ran) in research/drafting/results/drafting_adaptive.json and rewrites the
.md and .png from all rows (one configuration per call keeps each run under 10 minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from specfill.api import encode_prompt, load, load_speculator
from specfill.core.crossover import calibration_dir
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine, machine_line

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path.home() / ".cache" / "specfill" / "models"
MAIN = str(MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
CONFIGS = {  # name -> (main model path or None for the demo model, draft, label)
    "pair": (MAIN, str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), "Qwen2.5-Coder 1.5B + 0.5B draft"),
    "pair-self": (MAIN, "self:8", "Qwen2.5-Coder 1.5B, self:8 draft"),
    "demo": (None, "self:8", "SmolLM2-135M (demo), self:8 draft"),
}


def prompts(tokenizer) -> dict[str, list[int]]:
    """code: 512 tokens of this project's Python, continued as text; prose: a novel-like passage
    and "Retell it in detail." through the chat template."""
    code = tokenizer.encode((ROOT / "results/drafting/code_prompt.txt").read_text())[:512]
    passage = (ROOT / "results/drafting/prose_prompt.txt").read_text().strip()
    messages = [{"role": "user", "content": passage + "\n\nRetell it in detail."}]
    prose = encode_prompt(tokenizer, tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return {"code": code, "prose": prose}


def generation(model, ids: list[int], max_tokens: int, drafting: Drafting | None) -> dict:
    """One greedy generation: its tokens, TTFT and decode tokens/s, and the drafting record."""
    info = GenerationInfo()
    started, stamps, tokens = time.perf_counter(), [], []
    for token in model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(), stop_ids=frozenset(),
                                     method=PrefillMethod(), info=info, drafting=drafting):
        stamps.append(time.perf_counter())
        tokens.append(token)
    decode_s = stamps[-1] - stamps[0]
    record = info.decode
    lengths = record.draft_lengths
    return {"tokens": tokens, "ttft_s": stamps[0] - started, "decode_s": decode_s,
            "decode_tps": (len(tokens) - 1) / decode_s, "drafted": record.drafted_tokens,
            "accepted": record.accepted_tokens,
            "acceptance": record.accepted_tokens / record.drafted_tokens if record.drafted_tokens else None,
            "k_trajectory": lengths, "mean_k": sum(lengths) / len(lengths) if lengths else 0.0,
            "plain_rounds": sum(1 for k in lengths if k == 0) / len(lengths) if lengths else 1.0,
            "draft_s": record.seconds.get("draft", 0.0), "verify_s": record.seconds.get("verify", 0.0),
            "draft_prefill_s": record.seconds.get("draft_prefill", 0.0), "skipped": record.skipped,
            "rounds_tps": (len(tokens) - 1) / (decode_s - record.seconds.get("draft_prefill", 0.0)),
            "load_1min": round(os.getloadavg()[0], 2)}


def run_config(name: str, max_k: int, max_tokens: int, only: list[str]) -> list[dict]:
    path, draft_path, label = CONFIGS[name]
    model, tokenizer = load(path, backend="cuda", dtype="float32", device="cpu")
    draft = load_speculator(draft_path, model, tokenizer, "float32", "cpu", role="draft model")
    rows = []
    for prompt, ids in prompts(tokenizer).items():
        if prompt not in only:
            continue
        generation(model, ids[:32], 4, Drafting(draft, 2))  # warm-up: shapes and the draft path
        plain = generation(model, ids, max_tokens, None)
        for schedule, drafting in (("fixed", Drafting(draft, max_k, adaptive=False)),
                                   ("adaptive, first use", Drafting(draft, max_k)),
                                   ("adaptive, costs kept", Drafting(draft, max_k))):
            if schedule == "adaptive, first use":  # nothing remembered: the pair's first decode here
                for book in calibration_dir().glob("*-drafting-*.json"):
                    book.unlink()
            row = generation(model, ids, max_tokens, drafting)
            row.update(config=name, label=label, prompt=prompt, prompt_tokens=len(ids), schedule=schedule,
                       max_k=max_k, plain_tps=plain["decode_tps"], plain_load_1min=plain["load_1min"],
                       speedup=row["decode_tps"] / plain["decode_tps"], identical=row["tokens"] == plain["tokens"])
            del row["tokens"]
            rows.append(row)
            print(f"{name} {prompt} {schedule}: {row['decode_tps']:.2f} tok/s vs plain {plain['decode_tps']:.2f} "
                  f"({row['speedup']:.2f}x), accepted {row['accepted']}/{row['drafted']}, mean k "
                  f"{row['mean_k']:.2f}, same tokens {row['identical']}, load {row['load_1min']}", flush=True)
    return rows


def summary(trajectory: list[int]) -> str:
    """The k of the first rounds, then the rest as value x count runs."""
    runs: list[list[int]] = []
    for k in trajectory:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    text = " ".join(f"{k}" if n == 1 else f"{k}x{n}" for k, n in runs[:14])
    return text + (" ..." if len(runs) > 14 else "")


def write(result: dict, out: Path) -> None:
    rows = result["rows"]
    lines = ["# Speculative decoding: fixed draft length k against the adaptive draft length", "",
             f"Machine: {machine_line(result['machine'])}; torch backend on cpu, float32 (bf16 matmuls are "
             f"~50x slower on this AVX2-only CPU). The load average before plain decoding / after each run "
             f"is in its row.",
             f"Greedy, {result['max_tokens']} new tokens; decode tok/s from the first to the last token (a draft "
             f"model's prompt prefill included; the column after the speed-up leaves it out and gives its "
             f"seconds); speed-up against plain decoding run just before, same process. "
             f"`research/drafting/bench_drafting_adaptive.py`.", "",
             "| model | prompt | schedule | max k | decode tok/s | plain tok/s | speed-up | without draft prefill "
             "| accepted / drafted | mean k | plain rounds | k per round | same tokens | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rate = "-" if r["acceptance"] is None else f"{r['accepted']}/{r['drafted']} ({100 * r['acceptance']:.0f}%)"
        lines.append(f"| {r['label']} | {r['prompt']} ({r['prompt_tokens']}) | {r['schedule']} | {r['max_k']} "
                     f"| {r['decode_tps']:.2f} | {r['plain_tps']:.2f} | **{r['speedup']:.2f}x** "
                     f"| {r['rounds_tps'] / r['plain_tps']:.2f}x ({r['draft_prefill_s']:.1f} s) | {rate} "
                     f"| {r['mean_k']:.2f} | {100 * r['plain_rounds']:.0f}% "
                     f"| {'skipped: no draft prefill' if r.get('skipped') else summary(r['k_trajectory'])} "
                     f"| {r['identical']} | {r['plain_load_1min']} / {r['load_1min']} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(rows, out.with_suffix(".png"), result["machine"])


def plot(rows: list[dict], path: Path, machine: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["label"], r["prompt"]) for r in rows}, key=lambda c: (c[0], c[1]))
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.27
    for offset, schedule in ((-width, "fixed"), (0.0, "adaptive, first use"), (width, "adaptive, costs kept")):
        values = [next((r["speedup"] for r in rows if (r["label"], r["prompt"]) == c and r["schedule"] == schedule),
                       0.0) for c in cases]
        bars = ax.bar([i + offset for i in range(len(cases))], values, width, label=schedule)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.97, color="red", linewidth=0.8, linestyle="--", label="0.97x floor")
    ax.set_xticks(range(len(cases)), [f"{label}\n{prompt}" for label, prompt in cases], fontsize=7)
    ax.set_ylabel("decode speed-up vs plain decoding")
    ax.set_title(f"Drafting, fixed vs adaptive k: {', '.join(sorted({r['label'] for r in rows}))}; float32, cpu "
                 f"({machine['cpu']}), {machine.get('torch_threads', '?')} threads, load ~{machine.get('load_average_1min')}",
                 fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", default="code,prose", help="comma-separated: code, prose")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "drafting_adaptive"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["SPECFILL_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="specfill-drafting-bench-")
    out = Path(args.out)
    only = args.prompts.split(",")
    rows = run_config(args.config, args.max_k, args.max_tokens, only)
    old = json.loads(out.with_suffix(".json").read_text())["rows"] if out.with_suffix(".json").exists() else []
    rows = [r for r in old if r["config"] != args.config or r["prompt"] not in only] + rows
    write({"machine": describe_machine(), "max_tokens": args.max_tokens, "rows": rows}, out)


if __name__ == "__main__":
    main()
