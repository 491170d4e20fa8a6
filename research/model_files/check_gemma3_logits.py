"""Gemma 3 270M (the Q4_K_M GGUF of scripts/fetch_gemma3_270m.sh): our logits on both backends
against transformers loading the same GGUF, plus greedy answers through each method.

Both sides read the same quantized file and dequantize it to float32, then compute in float32, so
the logits differ by float32 rounding only (no quantized activations, unlike llama.cpp). The
prompts: the capital question (13 tokens) and 1,200 tokens of the evaluation text, which crosses
the 512-position sliding window of 15 of the 18 layers (and reaches the global layers' RoPE base
of 10^6 and the local one of 10^4 at long range). Writes research/model_files/results/gemma3-270m-logits.{json,md}.

usage: OMP_NUM_THREADS=2 .venv/bin/python research/model_files/check_gemma3_logits.py [GGUF]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from specfill import generate, load
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.evaluation.machine import describe_machine, machine_line
from specfill.evaluation.texts import tokens_of_length

DEFAULT = Path.home() / ".cache/specfill/models/gemma-3-270m-q4_k_m.gguf"
QUESTION = "Question: What is the capital of France?\nAnswer:"
KEEP = 256  # positions compared per prompt (the last ones)
# max |logit diff| / max |logit|: float32 rounding over 18 layers and a 262K-way head; observed
# <= 6e-6 (2026-11-23), so 1e-4 leaves a 15x margin and still catches a wrong norm, window or scale
TOLERANCE = 1e-4
# H2O with chunks of 256 (the 512-position window spans two); SpecPrefill keeping 30% of the chunks
METHODS = {"full": {}, "h2o": {"method": "h2o", "h2o": H2OConfig(chunk_size=256, batch_size=512, local=64,
                                                                  heavy=64, dense_tail=64)},
           "specprefill": {"method": "specprefill", "speculator": "self:12",
                           "specprefill": SpecPrefillConfig(keep_ratio=0.3)}}
OUT = Path(__file__).resolve().parent / "results"


def transformers_logits(path: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():  # the last KEEP positions: those past the window, at a fraction of the memory
        return model(torch.tensor([ids]), logits_to_keep=KEEP).logits[0].float().numpy()


def compare(ours: np.ndarray, theirs: np.ndarray) -> dict:
    diff = np.abs(ours - theirs)
    return {"max_abs_diff": float(diff.max()), "max_abs_logit": float(np.abs(theirs).max()),
            "relative": float(diff.max() / np.abs(theirs).max()),
            "top1_agreement": float((ours.argmax(-1) == theirs.argmax(-1)).mean()),
            "last_top1_equal": bool(ours[-1].argmax() == theirs[-1].argmax())}


def main(path: Path) -> None:
    rows, answers = {}, {}
    for backend in ("cuda", "mlx"):
        model, tokenizer = load(str(path), backend=backend, dtype="float32")
        prompts = {"question (13 tokens)": tokenizer.encode(QUESTION),
                   "eval text (1200 tokens)": [tokenizer.bos_token_id] + tokens_of_length(tokenizer, 1199)}
        for name, ids in prompts.items():
            if name not in rows:
                rows[name] = {"n_tokens": len(ids), "transformers": transformers_logits(path, ids)}
            ours = np.asarray(model.ops.to_numpy(model(ids)[0]))[-KEEP:]
            rows[name][backend] = compare(ours, rows[name]["transformers"])
        long_question = tokenizer.decode(tokens_of_length(tokenizer, 1000)) + "\n\n" + QUESTION
        for prompt_name, prompt in (("question", QUESTION), ("1K-token text + question", long_question)):
            for name, kwargs in METHODS.items():
                answers[f"{backend} {name}, {prompt_name}"] = generate(model, tokenizer, prompt, max_tokens=4, **kwargs)
        del model
    report = {"model": path.name, "dtype": "float32", "tolerance_relative": TOLERANCE,
              "machine": describe_machine(), "date": time.strftime("%Y-%m-%d"),
              "prompts": {k: {b: v[b] for b in ("cuda", "mlx")} | {"n_tokens": v["n_tokens"]} for k, v in rows.items()},
              "answers": answers}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gemma3-270m-logits.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / "gemma3-270m-logits.md").write_text(markdown(report))
    print(markdown(report))
    ok = all(r[b]["relative"] <= TOLERANCE for r in report["prompts"].values() for b in ("cuda", "mlx"))
    sys.exit(0 if ok and all("Paris" in answers[f"{b} full, question"] for b in ("cuda", "mlx")) else 1)


def markdown(report: dict) -> str:
    lines = [f"# Gemma 3 270M ({report['model']}): logits against transformers on the same GGUF", "",
             f"float32 on both sides, {machine_line(report['machine'])}, {report['date']}. Tolerance: max |logit diff| "
             f"<= {report['tolerance_relative']:g} x max |logit| (both dequantize the same Q4_K_M file to float32 and "
             "compute in float32: only float32 rounding differs, accumulated over 18 layers and a 262,144-way head).", "",
             f"The last {KEEP} positions of each prompt are compared (all of the short one).", "",
             "| prompt | backend | max abs diff | max abs logit | relative | top-1 agreement | last top-1 equal |",
             "|---|---|---|---|---|---|---|"]
    for name, row in report["prompts"].items():
        for backend in ("cuda", "mlx"):
            r = row[backend]
            lines.append(f"| {name} | {backend} | {r['max_abs_diff']:.2e} | {r['max_abs_logit']:.1f} | {r['relative']:.2e} "
                         f"| {r['top1_agreement']:.4f} | {r['last_top1_equal']} |")
    lines += ["", "Greedy answers (4 tokens) to `Question: What is the capital of France?\\nAnswer:`, alone and after "
              "1,000 tokens of the evaluation text (past the 512-position window); H2O: S = 256, L = H = 64, "
              "dense tail 64; SpecPrefill: self:12 speculator, keep 0.3:", ""]
    lines += [f"- {name}: `{answer!r}`" for name, answer in report["answers"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
