"""The transformers adapter against specfill's own torch model and transformers' own forward, on
real weights: one GGUF of an own family (torch CPU, fp32), issue 21 item 2's check outside the
tiny test models.

The GGUF is read twice: into specfill's own model (its GGUF loader), and into transformers' model
(its GGUF support, `gguf_file=`, dequantized with gguf-py too) that the adapter takes over. On a
prompt of N ids of real text: every position's logits of the adapter against transformers' own
forward (SDPA) and against the own model; greedy tokens and SpecPrefill's kept positions under
full prefill, H2O and SpecPrefill, own model against adapter; full-prefill seconds of all three.
Writes research/adapter_speed/results/torch_parity_<model>.{json,md}.

    flock /work/model.lock .venv/bin/python research/adapter_speed/parity_torch_adapter.py \\
        ~/.cache/specfill/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --tokens 1024
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.adapted_loader import load_adapted
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine, machine_line

TEXT = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
        "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n")


def methods() -> dict[str, PrefillMethod]:
    return {"full": PrefillMethod(),
            "h2o": PrefillMethod("h2o", h2o=H2OConfig(chunk_size=128, batch_size=512, local=32, heavy=32)),
            "specprefill": PrefillMethod("specprefill", speculator="self:8",
                                         specprefill=SpecPrefillConfig(keep_ratio=0.3))}


def generated(model, ids: list[int], method: PrefillMethod, tokens: int) -> tuple[list[int], list[int], float]:
    """(greedy tokens, SpecPrefill's kept positions, seconds to the first token)."""
    info = GenerationInfo()
    start = time.perf_counter()
    stream = model.generate_step(ids, max_tokens=tokens, sampling=SamplingConfig(), stop_ids=frozenset(),
                                 method=method, info=info)
    first = [next(stream)]
    ttft = time.perf_counter() - start
    return first + list(stream), list(info.kept_positions or []), ttft


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--generate", type=int, default=16)
    options = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    own, tokenizer = load(options.gguf, dtype="float32", device="cpu")
    ours, _ = load_adapted(Path(options.gguf), torch.float32, torch.device("cpu"), 2048)
    ids = (tokenizer.encode(TEXT) * options.tokens)[:options.tokens]
    with torch.inference_mode():
        start = time.perf_counter()
        library = ours.model.lm(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
        t_library = time.perf_counter() - start
    start = time.perf_counter()
    adapter = ours.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    t_adapter = time.perf_counter() - start
    start = time.perf_counter()
    own_logits = own.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    t_own = time.perf_counter() - start
    rows = {}
    for name, method in methods().items():
        own_tokens, own_kept, own_ttft = generated(own, ids, method, options.generate)
        our_tokens, our_kept, our_ttft = generated(ours, ids, method, options.generate)
        rows[name] = {"tokens_equal": own_tokens == our_tokens, "kept_equal": own_kept == our_kept,
                      "kept": len(our_kept), "own_ttft_s": own_ttft, "adapter_ttft_s": our_ttft,
                      "own_text": tokenizer.decode(own_tokens), "adapter_text": tokenizer.decode(our_tokens)}
        print(name, json.dumps(rows[name]), flush=True)
    info = describe_machine({"torch_threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0]})
    report = {"model": Path(options.gguf).name, "dtype": "float32", "device": "torch CPU", "prompt_tokens": len(ids),
              "adapter_vs_transformers": relative(adapter, library), "adapter_vs_own": relative(adapter, own_logits),
              "full_prefill_s": {"transformers": t_library, "adapter": t_adapter, "own": t_own},
              "methods": rows, "machine": info}
    write(report, Path(__file__).resolve().parent / "results" / f"torch_parity_{Path(options.gguf).stem}")


def write(report: dict, stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.parent.joinpath(stem.name + ".json").write_text(json.dumps(report, indent=1))
    seconds = report["full_prefill_s"]
    lines = [f"# transformers adapter parity (torch): {report['model']}", "",
             f"{report['dtype']}, {report['device']}, {report['prompt_tokens']} prompt tokens; "
             f"{machine_line(report['machine'])} (a shared machine under load from other jobs: timings are "
             f"not quiet-machine figures).", "",
             "Generated by `research/adapter_speed/parity_torch_adapter.py`: the GGUF read by specfill's own loader and by "
             "transformers' GGUF support (both dequantize with gguf-py); the adapter runs transformers' model.", "",
             f"- every position's logits, adapter vs transformers' own forward (SDPA): max |diff| / max |logit| = "
             f"{report['adapter_vs_transformers']:.2e}",
             f"- adapter vs specfill's own model: {report['adapter_vs_own']:.2e}",
             f"- full prefill: transformers {seconds['transformers']:.2f} s, adapter {seconds['adapter']:.2f} s, "
             f"own model {seconds['own']:.2f} s (one run each)", "",
             "| method | greedy tokens equal (own vs adapter) | kept positions equal | kept | TTFT own (s) | "
             "TTFT adapter (s) |", "|---|---|---|---|---|---|"]
    for name, row in report["methods"].items():
        lines.append(f"| {name} | {row['tokens_equal']} | {row['kept_equal']} | {row['kept']} | "
                     f"{row['own_ttft_s']:.2f} | {row['adapter_ttft_s']:.2f} |")
    stem.parent.joinpath(stem.name + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
