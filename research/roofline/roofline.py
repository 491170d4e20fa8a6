"""Predicted TTFT per method on GPUs (roofline, vendor peaks) and the model checked on this CPU.

    .venv/bin/python research/roofline/roofline.py                   # GPU table + anchors -> research/roofline/results/roofline.*
    flock /work/model.lock .venv/bin/python research/roofline/roofline.py --validate   # + this CPU vs `specfill bench`

--validate measures this machine's GEMM / attention / copy rates (evaluation/rates.py) on the demo
model's shapes, then runs `specfill bench`'s code on the demo model (torch, CPU, fp32) at 2K-8K
and compares the formula's TTFT with the measured one, right after, under the same load.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.evaluation.roofline import DEVICES, Method, Shape, predict, predict_bench_rows

# published configs (Hugging Face config.json of each model)
LLAMA_1B = Shape("Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256)
LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_405B = Shape("Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256)
LENGTHS = (8192, 16384, 32768, 65536, 131072)


def methods(shape: Shape) -> dict[str, Method]:
    """full, H2O (defaults), SpecPrefill keep 0.1 with self:K (a quarter of the layers, as
    scripts/gpu_session.sh) and, for a bigger main model, with the 1B speculator."""
    out = {"full": Method("full"), "h2o": Method("h2o"),
           f"specprefill self:{shape.layers // 4}": Method("specprefill", speculator=shape.first_layers(shape.layers // 4))}
    if shape.layers > LLAMA_1B.layers:
        out["specprefill 1B speculator"] = Method("specprefill", speculator=LLAMA_1B)
    return out


def gpu_table() -> list[dict]:
    rows = []
    for key in ("h100", "rtx4090", "orin"):
        for shape in (LLAMA_1B, LLAMA_8B):
            for tokens in LENGTHS:
                full = predict(shape, DEVICES[key], tokens, Method("full"))["ttft"]
                for name, method in methods(shape).items():
                    ttft = predict(shape, DEVICES[key], tokens, method)["ttft"]
                    rows.append({"device": DEVICES[key].name, "model": shape.name, "method": name,
                                 "prompt_tokens": tokens, "ttft_s": ttft, "speedup_vs_full": full / ttft})
    return rows


def anchors() -> list[dict]:
    """Published speed-ups beside this model's figure for the nearest setting it can express."""
    def speedup(shape, key, tokens, method):
        return predict(shape, DEVICES[key], tokens, Method("full"))["ttft"] / predict(shape, DEVICES[key], tokens, method)["ttft"]
    luce = speedup(LLAMA_8B, "rtx3090", 131072, Method("specprefill", speculator=LLAMA_1B, keep=0.05))
    spec = [speedup(LLAMA_405B, "h100", n, Method("specprefill", speculator=LLAMA_1B)) for n in LENGTHS]
    return [
        {"anchor": "Luce PFlash (lucebox-hub): 10.4x TTFT at 128K on an RTX 3090 (24.8 s vs 257 s for llama.cpp)",
         "published": 10.4, "setting": "Qwen3.6-27B Q4_K_M target, Qwen3-0.6B drafter with block-sparse "
         "attention, keep 0.05, baseline llama.cpp", "modelled": f"Llama-3.1-8B + 1B speculator, keep 0.05, "
         "RTX 3090, 128K", "predicted": luce},
        {"anchor": "SpecPrefill paper (Liu et al., arXiv 2502.02789): up to 7.66x TTFT on Llama-3.1-405B",
         "published": 7.66, "setting": "405B FP8 main on 8 H100s, Llama-3.2-1B speculator",
         "modelled": "Llama-3.1-405B + 1B speculator, keep 0.1, H100 peaks, 8K-128K (one GPU's rates; "
         "tensor parallelism scales both sides alike)", "predicted": max(spec), "predicted_by_length":
         dict(zip(LENGTHS, spec))}]


def validate(log=print) -> dict:
    """Measured rates, then the bench on the demo model, then prediction vs measurement."""
    import torch

    from specfill.api import load
    from specfill.evaluation.bench import BenchPlan, run_bench
    from specfill.evaluation.rates import torch_rates
    load_before = os.getloadavg()
    model, _ = load(None, backend="cuda", dtype="float32", device="cpu")
    shape = Shape.from_args("demo (SmolLM2-135M)", model.model.args)
    del model
    rates = torch_rates(shape)
    log(f"rates: {rates}")
    plan = BenchPlan(backends=("cuda",), lengths=(2000, 4000, 8000), speculator="self:8", h2o=H2OConfig(),
                     specprefill=SpecPrefillConfig(), decode_tokens=2, dtype="float32", device="cpu")
    bench = run_bench(plan, log=log)
    rows = predict_bench_rows(shape, rates, bench["rows"], plan.speculator, width=4, h2o=plan.h2o,
                              lookahead=plan.specprefill.lookahead)
    return {"rates": vars(rates), "threads": torch.get_num_threads(), "rows": rows,
            "machine": {**_machine(), "load_before": load_before}}


def _machine() -> dict:
    from specfill.evaluation.machine import describe_machine
    info = describe_machine()
    return {"cpu": info["cpu"], "cpu_features": info["cpu_features"], "cores": info["cores"],
            "load": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="also check the model on this CPU (runs the demo model)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    from roofline_report import write_report  # research/roofline/roofline_report.py
    result = {"devices": {k: vars(v) for k, v in DEVICES.items()}, "table": gpu_table(), "anchors": anchors()}
    previous = args.out / "roofline.json"
    if args.validate:
        result["validation"] = validate()
    elif previous.is_file():  # keep the last validation when only the table is refreshed
        result["validation"] = json.loads(previous.read_text()).get("validation")
    for path in write_report(result, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
