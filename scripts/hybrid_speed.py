"""Speed of a hybrid through the torch adapter (issue 36 item 5): specfill's full prefill against
transformers' own forward, and H2O / SpecPrefill against full prefill, on random weights of a
realistic shape. scripts/gpu_session.sh's hybrid step on a GPU; by hand on any machine:

    nice -n 19 .venv/bin/python scripts/hybrid_speed.py --out results/hybrid/NAME \\
        --backend cuda --device cpu --dtype bfloat16 --threads 8 --parity-length 2048 --lengths 4096 8192

writes NAME.json, NAME.md and NAME.png (each atomically, rewritten after every row). Steps:

1. A transformers qwen3_5_text checkpoint of `--shape` with seeded random weights (timing does not
   depend on the weights' values; which tokens SpecPrefill keeps does) and a word-level tokenizer,
   written once to a temporary directory (or to `--checkpoint DIR`, kept, and reused by a later run of the
   same shape); every step below loads it from there.
2. Parity at `--parity-length`: (a) transformers' own forward over the prompt, one call as its
   generate's prefill makes it (use_cache=True on a fresh cache, logits of the last token only),
   against (b) specfill's full prefill through the adapter (TTFT of `specfill.stream_generate`
   with one token, the same prompt, dtype, device and threads). One warm-up of each on the same
   prompt first, then one timed run each; the two models are never held at once.
3. `full`, `h2o` and `specprefill` at `--lengths` through evaluation/bench.py's run_bench (rows
   carry the machine, its load and each run's peak memory), on seeded random prompt ids. Without
   its `auto` calibration: core/probe.py times a one-layer view, and this model's layer 0 is a
   recurrent layer, on which H2O is refused.

The speculator is the model's own first K layers ("self:K"), K a quarter of the layers but at least
up to the first attention layer (a speculator scores with its attention layers only): it needs no
second checkpoint and reads the same weights, so the row measures SpecPrefill's algorithm rather
than a second model's load. The shape's numbers are printed and written with the results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# transformers' qwen3_5_text config. "qwen3.5-0.8b": the published Qwen3.5 small text model's sizes
# (hidden 1024, MLP 3584, 8 query / 2 key-value heads of 256, every fourth layer full attention,
# gated delta-net with 16 key / 16 value heads of 128, conv kernel 4, vocabulary 248320, tied
# embeddings) at its 24 layers; "tiny": seconds, for the smoke test.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3.5-0.8b": dict(
        hidden_size=1024,
        num_hidden_layers=24,
        intermediate_size=3584,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        vocab_size=248320,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
}
COMMON = dict(rms_norm_eps=1e-6, max_position_embeddings=65536, bos_token_id=None, eos_token_id=None)
METHODS = ("full", "h2o", "specprefill")
LINEAR_KERNELS = {"flash-linear-attention": "fla", "causal-conv1d": "causal_conv1d"}


def speculator_layers(shape: dict[str, Any]) -> int:
    """K of the "self:K" speculator: a quarter of the layers, at least through the first attention layer."""
    return max(shape["num_hidden_layers"] // 4, shape["full_attention_interval"])


def build_checkpoint(directory: Path, shape: dict[str, Any], seed: int = 0) -> Path:
    """A transformers directory (config.json, model.safetensors in float32, a word-level
    tokenizer.json over the vocabulary) of a qwen3_5_text model of `shape` with seeded weights."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model("qwen3_5_text", **{**COMMON, **shape})
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(shape["vocab_size"])}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.save(str(directory / "tokenizer.json"))
    return directory


def reused_checkpoint(directory: Path, shape: dict[str, Any]) -> Path:
    """`directory` as the checkpoint of `shape`: built there when absent (in a sibling .part directory, renamed
    whole, so a run stopped mid-write leaves nothing a later run would read), reused when its shape.json says
    the same shape (scripts/gpu_session.sh's hybrid step: one checkpoint for both of its runs), refused otherwise."""
    marker = directory / "shape.json"
    if directory.exists():
        if not marker.is_file() or json.loads(marker.read_text()) != shape:
            raise SystemExit(f"hybrid_speed: {directory} holds no checkpoint of this shape (shape.json): remove it")
        return directory
    staging = directory.with_name(directory.name + ".part")
    if staging.exists():
        shutil.rmtree(staging)
    build_checkpoint(staging, shape)
    (staging / "shape.json").write_text(json.dumps(shape))
    staging.rename(directory)
    return directory


def linear_kernels() -> str:
    """Which fast kernels transformers' delta-net layers find here (both sides run the same ones)."""
    import importlib.util

    found = {name: importlib.util.find_spec(module) is not None for name, module in LINEAR_KERNELS.items()}
    return ", ".join(f"{name} {'installed' if ok else 'absent (torch fallback)'}" for name, ok in found.items())


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def transformers_prefill(directory: Path, ids: list[int], dtype: str, device: str) -> dict[str, float]:
    """(a): transformers' own forward over `ids`, a warm-up then one timed call (seconds)."""
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).to(device).eval()
    tensor = torch.tensor([ids], device=device)
    times = []
    with torch.inference_mode():
        for _ in range(2):  # the warm-up, then the timed call
            _synchronize(device)
            start = time.perf_counter()
            lm(input_ids=tensor, use_cache=True, logits_to_keep=1)
            _synchronize(device)
            times.append(time.perf_counter() - start)
    del lm
    gc.collect()
    return {"warmup_s": times[0], "ttft_s": times[1]}


def specfill_prefill(directory: Path, ids: list[int], dtype: str, device: str) -> dict[str, float]:
    """(b): specfill's full prefill through the adapter: a warm-up then one timed TTFT (seconds)."""
    import specfill

    model, tokenizer = specfill.load(str(directory), backend="cuda", dtype=dtype, device=device)
    times = []
    for _ in range(2):
        last = None
        for last in specfill.stream_generate(model, tokenizer, ids, 1):
            pass
        times.append(last.ttft)
    del model
    gc.collect()
    return {"warmup_s": times[0], "ttft_s": times[1]}


def title(result: dict) -> str:
    return (
        f"{result['shape_name']} (random weights), {result['dtype']}, {result['device']}, {result['threads']} thread(s)"
    )


def markdown(result: dict) -> str:
    state = "" if result["complete"] else "Partial: the run has not finished (or was stopped).\n\n"
    shape = ", ".join(f"{k}={v}" for k, v in result["shape"].items())
    lines = [
        f"# Hybrid speed: {title(result)}",
        "",
        state + f"Machine: {result['machine_line']}. Script: scripts/hybrid_speed.py (its docstring: the steps). "
        f"Shape: transformers' qwen3_5_text with {shape}. Speculator: {result['speculator']}. "
        f"Linear-attention kernels: {result['linear_kernels']}.",
        "",
        "## Full prefill: the adapter against transformers' own forward",
        "",
        "| prompt tokens | transformers forward (s) | specfill full prefill TTFT (s) | specfill / transformers |",
        "|---|---|---|---|",
    ]
    for p in result["parity"]:
        ratio = p["specfill_s"] / p["transformers_s"] if p.get("specfill_s") else None
        lines.append(
            f"| {p['prompt_tokens']} | {p['transformers_s']:.3f} | "
            f"{'-' if ratio is None else format(p['specfill_s'], '.3f')} | {'-' if ratio is None else f'{ratio:.3f}'} |"
        )
    lines += [
        "",
        "## Methods (evaluation/bench.py run_bench)",
        "",
        "| method | prompt tokens | TTFT (s) | speed-up vs full | kept | peak memory (GB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = f"{r['ttft_speedup_vs_full']:.2f}x" if r.get("ttft_speedup_vs_full") else "-"
        lines.append(
            f"| {r['method']} | {r['prompt_tokens']} | {r['ttft_s']:.3f} | {ratio} | {r['kept_tokens']} "
            f"| {r['peak_memory_gb']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def write(result: dict, stem: Path) -> list[Path]:
    """STEM.json, STEM.md and STEM.png, each written whole then renamed into place."""
    from specfill.evaluation.plots import plot_ttft
    from specfill.evaluation.ruler_protocol import write_atomic

    paths = [stem.with_name(stem.name + suffix) for suffix in (".json", ".md", ".png")]
    write_atomic(paths[0], json.dumps(result, indent=1) + "\n")
    write_atomic(paths[1], markdown(result))
    sides = {"transformers": "parity: transformers forward", "specfill": "parity: specfill adapter"}
    points = [
        {"backend": label, "method": "full", "prompt_tokens": p["prompt_tokens"], "ttft_s": p[f"{side}_s"]}
        for p in result["parity"]
        for side, label in sides.items()
        if p.get(f"{side}_s") is not None
    ]
    points += [{**r, "backend": "specfill"} for r in result["rows"]]
    if points:
        plot_ttft(points, paths[2], f"TTFT: {title(result)}")
    return paths


def run(args: argparse.Namespace) -> dict:
    import torch

    from specfill.core.io.random_model import random_prompt_ids
    from specfill.evaluation.bench import BenchPlan, run_bench
    from specfill.evaluation.machine import describe_machine, machine_line

    if args.threads:
        torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    k = speculator_layers(shape)
    stem = args.out.parent / args.out.name
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {text}", flush=True)

    machine = describe_machine()
    result: dict[str, Any] = {
        "shape_name": args.shape,
        "shape": shape,
        "dtype": args.dtype,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "speculator": f"self:{k} (the model's first {k} of {shape['num_hidden_layers']} layers)",
        "machine": machine,
        "machine_line": machine_line(machine),
        "linear_kernels": linear_kernels(),
        "parity": [],
        "rows": [],
        "complete": False,
    }
    progress(f"shape {args.shape}: {json.dumps(shape)}; {result['speculator']}; {result['threads']} thread(s)")
    with tempfile.TemporaryDirectory() as built:
        if args.checkpoint is None:
            directory = build_checkpoint(Path(built, "model"), shape)
            progress(f"checkpoint written to {directory}")
        else:
            reused = args.checkpoint.exists()
            directory = reused_checkpoint(args.checkpoint, shape)
            progress(f"checkpoint {'reused' if reused else 'written'}: {directory}")
        ids = random_prompt_ids(shape["vocab_size"], args.parity_length, seed=args.parity_length)
        parity = {"prompt_tokens": args.parity_length}
        result["parity"].append(parity)
        parity["transformers_s"] = transformers_prefill(directory, ids, args.dtype, args.device)["ttft_s"]
        write(result, stem)
        progress(f"parity {args.parity_length}: transformers forward {parity['transformers_s']:.3f} s")
        parity["specfill_s"] = specfill_prefill(directory, ids, args.dtype, args.device)["ttft_s"]
        parity["ratio"] = parity["specfill_s"] / parity["transformers_s"]
        write(result, stem)
        progress(f"parity {args.parity_length}: specfill full {parity['specfill_s']:.3f} s ({parity['ratio']:.3f}x)")
        plan = BenchPlan(
            backends=("cuda",),
            methods=METHODS,
            lengths=tuple(args.lengths),
            model=str(directory),
            speculator=f"self:{k}",
            decode_tokens=1,
            dtype=args.dtype,
            device=args.device,
        )

        def row_done(partial: dict) -> None:
            result["rows"] = partial["rows"]
            write(result, stem)

        bench = run_bench(
            plan,
            log=progress,
            step=lambda total, label: progress(f"{label} ({total} runs in all)"),
            row_done=row_done,
            calibrate=False,
            prompts=lambda tokenizer, length: random_prompt_ids(shape["vocab_size"], length, seed=length),
        )
    result["rows"], result["complete"] = bench["rows"], True
    result["machine_after"] = describe_machine()
    paths = write(result, stem)
    progress("wrote " + ", ".join(map(str, paths)))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results stem: writes STEM.json, STEM.md, STEM.png")
    parser.add_argument("--backend", choices=("cuda",), default="cuda", help="the torch backend (transformers)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.5-0.8b")
    parser.add_argument("--parity-length", type=int, default=2048, help="prompt tokens of steps (a) and (b)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192], help="the methods' prompt lengths")
    parser.add_argument(
        "--checkpoint", type=Path, help="the random checkpoint's directory, kept: built there when absent, else reused"
    )
    args = parser.parse_args(argv)
    if args.parity_length < 16 or min(args.lengths) < 16:
        parser.error("prompt lengths must be at least 16 tokens")
    run(args)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
