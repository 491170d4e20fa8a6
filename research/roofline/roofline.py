"""Predicted TTFT per method on GPUs (roofline, vendor peaks) and the model checked on this CPU.

    .venv/bin/python research/roofline/roofline.py                   # GPU tables + anchors -> research/roofline/results/roofline.*
                                                                      # and Mac Studios over Thunderbolt 5 -> roofline_macs.*
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
from specfill.evaluation.roofline import DEVICES, LINKS, Method, Parallel, Shape, predict, predict_bench_rows

# published configs (Hugging Face config.json of each model)
LLAMA_1B = Shape("Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256)
LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_405B = Shape("Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256)
LLAMA_70B = Shape("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256)
QWEN_CODER_15B = Shape("Qwen2.5-Coder-1.5B", 28, 1536, 12, 2, 128, 8960, 151936)
QWEN_CODER_05B = Shape("Qwen2.5-Coder-0.5B", 24, 896, 14, 2, 64, 4864, 151936)
# PFlash's pair: Qwen3.6-27B's config was not found here; Qwen3-32B (dense, 64 layers) stands in for it
QWEN3_32B = Shape("Qwen3-32B (stand-in for Qwen3.6-27B)", 64, 5120, 64, 8, 128, 25600, 151936)
QWEN3_06B = Shape("Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936)
LENGTHS = (8192, 16384, 32768, 65536, 131072)
SPEC_H2O = H2OConfig(layers="all")  # the composition's speculator: H2O defaults in every layer (issue 38)
H2O_ALL = H2OConfig(layers="all")
# main model + speculator pairs of the composition table (issue 38 item 4)
PAIRS = ((LLAMA_8B, LLAMA_1B), (QWEN_CODER_15B, QWEN_CODER_05B), (QWEN3_32B, QWEN3_06B))
KEEPS = (0.1, 0.3)  # the paper's keep ratio and this project's default (DEFAULT_KEEP_RATIO)
# what `auto`'s composition (core/config.AUTO_COMPOSITION: keep 0.1 up to 16,384 tokens, then a fixed budget
# of 1,639 chunk tokens; a 32-query window, one neighbour chunk each side) prefills with its main model: its
# keep share times NEIGHBOUR_GROWTH, the most one neighbour chunk each side can add (3: every kept chunk
# isolated). Measured on the proxy at 32K: 1.76 at keep 0.1 to 1.88 at 0.04
# (research/keep_length/results/composition_keeps_32k.json); at 128K the rule keeps 0.0125, below any
# measured ratio, so the bound (issue 47)
NEIGHBOUR_GROWTH = 3


def auto_share(tokens: int) -> float:
    """The share of a `tokens`-long prompt `auto`'s composition keeps (its rule, neighbours included)."""
    from specfill.core.config import AUTO_COMPOSITION

    return min(1.0, AUTO_COMPOSITION.share(tokens) * NEIGHBOUR_GROWTH)


MAC_LENGTH, MAC_RANKS = 32768, (1, 2, 4)


def methods(shape: Shape) -> dict[str, Method]:
    """full, H2O (defaults), SpecPrefill keep 0.1 with self:K (a quarter of the layers, as
    scripts/gpu_session.sh) and, for a bigger main model, with the 1B speculator."""
    self_k = shape.first_layers(shape.layers // 4)
    out = {"full": Method("full"), "h2o all layers": Method("h2o", h2o=H2O_ALL),
           "h2o default (first-0.33)": Method("h2o"),
           f"specprefill self:{shape.layers // 4}": Method("specprefill", speculator=self_k),
           f"specprefill self:{shape.layers // 4} + H2O speculator": Method("specprefill", speculator=self_k,
                                                                            speculator_h2o=SPEC_H2O)}
    if shape.layers > LLAMA_1B.layers:
        out["specprefill 1B speculator"] = Method("specprefill", speculator=LLAMA_1B)
        out["specprefill 1B speculator + H2O speculator"] = Method("specprefill", speculator=LLAMA_1B,
                                                                   speculator_h2o=SPEC_H2O)
    return out


def composition_table(keeps: tuple[float, ...] = KEEPS) -> list[dict]:
    """Issue 38 item 4: full, H2O, SpecPrefill and the composition per main + speculator pair, at
    keep 0.1 and 0.3, on H100, RTX 4090 and Orin, 8K-128K; speed-ups vs full."""
    rows = []
    for key in ("h100", "rtx4090", "orin"):
        for main, spec in PAIRS:
            for tokens in LENGTHS:
                full = predict(main, DEVICES[key], tokens, Method("full"))["ttft"]
                named = {"full": Method("full"), "h2o all layers": Method("h2o", h2o=H2O_ALL)}
                for keep in keeps:
                    named[f"specprefill keep {keep}"] = Method("specprefill", speculator=spec, keep=keep)
                    named[f"composition keep {keep}"] = Method("specprefill", speculator=spec, keep=keep,
                                                               speculator_h2o=SPEC_H2O)
                for name, method in named.items():
                    ttft = predict(main, DEVICES[key], tokens, method)["ttft"]
                    rows.append({"device": DEVICES[key].name, "model": f"{main.name} + {spec.name} speculator",
                                 "method": name, "prompt_tokens": tokens, "ttft_s": ttft,
                                 "speedup_vs_full": full / ttft})
    return rows


def auto_composition(spec: Shape, tokens: int = 131072) -> Method:
    """`auto`'s composition (core/config.AUTO_COMPOSITION) with this speculator, keeping auto_share(tokens):
    its speculator as deep as its pass runs (core/methods/speculator_depth.pass_depth: its scoring layers,
    no look-ahead), H2O in each of those layers."""
    from specfill.core.config import AUTO_COMPOSITION, layer_subset
    from specfill.core.methods.speculator_depth import pass_depth

    config = AUTO_COMPOSITION
    depth = pass_depth(spec.layers, layer_subset(config.layers, spec.layers), config.lookahead, 0)
    return Method("specprefill", speculator=spec.first_layers(depth) if depth < spec.layers else spec,
                  keep=auto_share(tokens), lookahead=config.lookahead, speculator_h2o=SPEC_H2O)


def acceptance(keeps: tuple[float, ...] = KEEPS) -> list[dict]:
    """Issues 38 and 47's line: does the roofline predict >= 6x for the composition at 128K on H100,
    at each keep ratio and at the share `auto`'s composition keeps there (auto_share)?"""
    out = []
    for main, spec in PAIRS:
        full = predict(main, DEVICES["h100"], 131072, Method("full"))["ttft"]
        named = {f"keep {k}": Method("specprefill", speculator=spec, keep=k, speculator_h2o=SPEC_H2O) for k in keeps}
        named["auto's composition"] = auto_composition(spec)
        for setting, method in named.items():
            keep = method.keep
            ttft = predict(main, DEVICES["h100"], 131072, method)["ttft"]
            out.append({"pair": f"{main.name} + {spec.name}", "keep": keep, "setting": setting,
                        "speedup": full / ttft, "meets_6x": full / ttft >= 6})
    return out


def macs_table() -> list[dict]:
    """Issue 39 item 4: Llama-3.1-70B (8B speculator, replicated) at 32K on 1, 2 and 4 M3 Ultra Mac
    Studios over Thunderbolt 5 RDMA, tensor and pipeline; speed-up vs full on one Mac."""
    rates, link = DEVICES["m3ultra"], LINKS["tb5"]
    named = {"full": Method("full"), "h2o all layers": Method("h2o", h2o=H2O_ALL),
             "h2o default (first-0.33)": Method("h2o"),
             "specprefill 8B speculator": Method("specprefill", speculator=LLAMA_8B),
             "composition (8B speculator + H2O)": Method("specprefill", speculator=LLAMA_8B, speculator_h2o=SPEC_H2O)}
    one_mac_full = predict(LLAMA_70B, rates, MAC_LENGTH, Method("full"))["ttft"]
    rows = []
    for ranks in MAC_RANKS:
        for kind in (("tensor", "pipeline") if ranks > 1 else ("one Mac",)):
            parallel = Parallel(kind, ranks, link) if ranks > 1 else None
            for name, method in named.items():
                parts = predict(LLAMA_70B, rates, MAC_LENGTH, method, parallel=parallel)
                comm = parts.get("communication", 0.0)
                rows.append({"macs": ranks, "kind": kind, "method": name, "ttft_s": parts["ttft"],
                             "communication_s": comm, "communication_share": comm / parts["ttft"],
                             "speedup_vs_one_mac_full": one_mac_full / parts["ttft"], "parts": parts})
    return rows


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
    luce_qwen = speedup(QWEN3_32B, "rtx3090", 131072, Method("specprefill", speculator=QWEN3_06B, keep=0.05,
                                                              speculator_h2o=SPEC_H2O))
    spec = [speedup(LLAMA_405B, "h100", n, Method("specprefill", speculator=LLAMA_1B)) for n in LENGTHS]
    return [
        {"anchor": "Luce PFlash (lucebox-hub): 10.4x TTFT at 128K on an RTX 3090 (24.8 s vs 257 s for llama.cpp)",
         "published": 10.4, "setting": "Qwen3.6-27B Q4_K_M target, Qwen3-0.6B drafter with block-sparse "
         "attention, keep 0.05, baseline llama.cpp", "modelled": f"Llama-3.1-8B + 1B speculator, keep 0.05, "
         "RTX 3090, 128K", "predicted": luce},
        {"anchor": "Luce PFlash (lucebox-hub, r/LocalLLaMA announcement 2026-05-01; theneuralfeed.com, "
         "insiderllm.com): 10.4x TTFT at 128K on an RTX 3090 (24.8 s vs 257 s for llama.cpp)",
         "published": 10.4, "setting": "as above: the drafter's attention block-sparse, as the composition's",
         "modelled": "the composition: Qwen3-32B shape (stand-in for Qwen3.6-27B) + Qwen3-0.6B speculator "
         "prefilling with H2O (all layers), keep 0.05, RTX 3090 bf16, 128K", "predicted": luce_qwen},
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
    parser.add_argument("--keeps", default=",".join(map(str, KEEPS)),
                        help="SpecPrefill keep ratios of the composition table and the 128K line, comma-separated "
                             "(e.g. a length rule's ratio at 128K)")
    args = parser.parse_args(argv)
    keeps = tuple(float(k) for k in args.keeps.split(","))
    from roofline_report import write_macs_report, write_report  # research/roofline/roofline_report.py
    result = {"devices": {k: vars(v) for k, v in DEVICES.items()}, "table": gpu_table(), "anchors": anchors(),
              "composition": composition_table(keeps), "acceptance": acceptance(keeps)}
    previous = args.out / "roofline.json"
    if args.validate:
        result["validation"] = validate()
    elif previous.is_file():  # keep the last validation when only the table is refreshed
        result["validation"] = json.loads(previous.read_text()).get("validation")
    for path in write_report(result, args.out):
        print(path)
    macs = {"device": vars(DEVICES["m3ultra"]), "link": vars(LINKS["tb5"]), "model": LLAMA_70B.name,
            "speculator": LLAMA_8B.name, "prompt_tokens": MAC_LENGTH, "table": macs_table()}
    for path in write_macs_report(macs, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
