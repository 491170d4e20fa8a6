"""Full-attention prefill speed: specfill's torch backend vs HF transformers (sdpa), one run.

Both engines see the same weights, dtype, device and prompt ids; each measurement is the time to
first token (prefill + LM head for the last position + greedy pick), the two engines alternating
so load drift hits both. Writes research/runtimes/results/bench_full_prefill_<device>.json and .md.

    python research/runtimes/bench_full_prefill.py                          # demo GGUF (SmolLM2), fp32
    python research/runtimes/bench_full_prefill.py --random-shape llama-1b --dtype bf16   # on a GPU
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

from specfill.backends.torch_cuda import from_weights, resolve_device, resolve_dtype
from specfill.core.driver import CausalLM
from specfill.core.io.demo_model import require_demo_model
from specfill.core.methods.prefill import prefill
from specfill.core.plan import check_token_ids
from specfill.core.models import ModelArgs
from specfill.core.io.random_model import RANDOM_SHAPES
from specfill.core.io.weights import load_weights

_HF_FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}


def hf_random(shape: str, dtype: torch.dtype, device: torch.device) -> tuple[Any, CausalLM]:
    config_kwargs = copy.deepcopy(RANDOM_SHAPES[shape])  # transformers edits nested dicts in place
    family = _HF_FAMILIES[config_kwargs.pop("model_type")]
    config = getattr(transformers, f"{family}Config")(**config_kwargs)
    torch.manual_seed(0)
    hf = getattr(transformers, f"{family}ForCausalLM")(config)
    weights = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    ours = from_weights(ModelArgs.from_hf_config(config.to_dict()), weights,
                                      dtype=dtype, device=device)
    del weights
    hf = hf.to(device=device, dtype=dtype)
    hf.config._attn_implementation = "sdpa"
    return hf.eval(), ours


def hf_from_gguf(path: Path, dtype: torch.dtype, device: torch.device) -> Any:
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype, attn_implementation="sdpa")
    return hf.to(device).eval()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], int], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def ours_ttft(model: CausalLM, ids: list[int]) -> int:
    """What generate_step runs before its first yield (called directly: an 8K prompt fills the
    whole 8K context of SmolLM2, leaving generate_step no room for max_tokens)."""
    tokens = check_token_ids(ids, model.args.vocab_size)
    with model.ops.device_scope():
        cache = model.ops.new_cache(model.model, len(tokens))
        logits = prefill(model.ops, model.model, model.ops.tokens(tokens), 0, cache,
                         step_size=model.prefill_step_size)
    return int(logits[-1].argmax())


@torch.inference_mode()
def hf_ttft(hf: Any, ids: torch.Tensor) -> int:
    # What transformers' generate() runs for the prompt: a cache and the last logits only.
    out = hf(ids, use_cache=True, logits_to_keep=1)
    return int(out.logits[0, -1].argmax())


class OtherLoad:
    """CPU time other processes used while we measured, in cores on average (Linux only):
    /proc/stat's busy jiffies minus this process's own CPU time."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        own = sum(os.times()[:2])
        return busy, own, time.monotonic()

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return max(others, 0.0) / (end[2] - self.start[2])


def machine(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "device": str(device),
            "dtype": str(dtype).removeprefix("torch.")}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def device_slug(info: dict[str, Any]) -> str:
    name = info.get("gpu") or f"cpu-{info['cpu']}-{info['cpu_count']}c"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    m = result["machine"]
    lines = [f"# Full-attention prefill: specfill torch vs HF transformers sdpa", "",
             f"- model: {result['model']}", f"- device: {m['device']}"
             + (f" ({m['gpu']})" if "gpu" in m else ""),
             f"- CPU: {m['cpu']}, {m['cpu_count']} cores, torch threads {m['torch_threads']}",
             f"- torch {m['torch']}, transformers {m['transformers']}, dtype {m['dtype']}",
             f"- prefill step size {result['prefill_step_size']}; TTFT = prefill + last-token logits"
             f" + greedy pick; median of {result['repeats']} alternating runs",
             f"- other processes used {result['other_cores']} cores on average while measuring"
             + (" (BUSY: they competed for our cores, treat the figures as rough)"
                if result["busy"] else ""), "",
             "| prompt tokens | specfill tok/s | HF sdpa tok/s | ratio (median) | ratio (best run) "
             "| specfill runs s | HF runs s |", "|---:|---:|---:|---:|---:|---|---|"]
    for row in result["rows"]:
        runs = lambda times: ", ".join(f"{t:.2f}" for t in times)
        lines.append(f"| {row['tokens']} | {row['ours_tok_s']:.1f} | {row['hf_tok_s']:.1f} | "
                     f"{row['ratio']:.2f}x | {row['ratio_of_best']:.2f}x | {runs(row['ours_runs_s'])} "
                     f"| {runs(row['hf_runs_s'])} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, help="GGUF file (default: the demo model)")
    source.add_argument("--random-shape", choices=sorted(RANDOM_SHAPES))
    parser.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16")
    parser.add_argument("--device", default=None)
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    lengths = [int(n) for n in args.lengths.split(",")]

    if args.random_shape:
        hf, ours = hf_random(args.random_shape, dtype, device)
        model_name = f"random weights, {args.random_shape} shape"
    else:
        path = args.model or require_demo_model()
        model_args, weights = load_weights(path)
        ours = from_weights(model_args, weights, dtype=dtype, device=device)
        del weights
        hf = hf_from_gguf(path, dtype, device)
        model_name = path.name
    vocab = ours.args.vocab_size

    ids_all = torch.randint(100, vocab, (max(lengths),), generator=torch.Generator().manual_seed(0))
    warm = ids_all[:256].tolist()
    ours_ttft(ours, warm), hf_ttft(hf, torch.tensor([warm], device=device))
    rows, other_load = [], OtherLoad()
    for n in lengths:
        ids = ids_all[:n].tolist()
        hf_ids = torch.tensor([ids], device=device)
        ours_s, hf_s = [], []
        for _ in range(args.repeats):
            ours_s.append(time_call(lambda: ours_ttft(ours, ids), device))
            hf_s.append(time_call(lambda: hf_ttft(hf, hf_ids), device))
        row = {"tokens": n, "ours_s": statistics.median(ours_s), "hf_s": statistics.median(hf_s),
               "ours_runs_s": ours_s, "hf_runs_s": hf_s}
        row |= {"ours_tok_s": n / row["ours_s"], "hf_tok_s": n / row["hf_s"],
                "ratio": row["hf_s"] / row["ours_s"], "ratio_of_best": min(hf_s) / min(ours_s)}
        rows.append(row)
        print(f"{n:6d} tokens: specfill {row['ours_tok_s']:8.1f} tok/s   HF {row['hf_tok_s']:8.1f} "
              f"tok/s   ratio {row['ratio']:.2f}x (best runs {row['ratio_of_best']:.2f}x)", flush=True)
    other_cores = other_load.cores()
    info = machine(device, dtype)
    # Busy: other processes took CPU time from the cores our threads needed.
    spare = (os.cpu_count() or 1) - torch.get_num_threads()
    busy = device.type == "cpu" and other_cores is not None and other_cores > spare + 0.1
    result = {"model": model_name, "machine": info, "prefill_step_size": ours.prefill_step_size,
              "repeats": args.repeats, "other_cores": None if other_cores is None
              else round(other_cores, 2), "busy": busy, "rows": rows,
              "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"bench_full_prefill_{device_slug(info)}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(stem.with_suffix(".md"), result)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
