"""roofline.json, roofline.md and roofline.png from research/roofline/roofline.py's result."""
from __future__ import annotations

import json
from pathlib import Path

from specfill.evaluation.plots import _pyplot, _save


def _table_lines(rows: list[dict]) -> list[str]:
    lengths = sorted({r["prompt_tokens"] for r in rows})
    lines = []
    for device in dict.fromkeys(r["device"] for r in rows):
        for model in dict.fromkeys(r["model"] for r in rows if r["device"] == device):
            lines += ["", f"**{model} on {device}** (bf16): predicted TTFT, speed-up vs full", "",
                      "| method | " + " | ".join(f"{n // 1024}K" for n in lengths) + " |",
                      "|---|" + "---|" * len(lengths)]
            picked = [r for r in rows if r["device"] == device and r["model"] == model]
            for method in dict.fromkeys(r["method"] for r in picked):
                cells = {r["prompt_tokens"]: r for r in picked if r["method"] == method}
                lines.append(f"| {method} | " + " | ".join(
                    f"{cells[n]['ttft_s']:.3g} s ({cells[n]['speedup_vs_full']:.1f}x)" for n in lengths) + " |")
    return lines


def _load(load: list[float] | None) -> str:
    return "?" if load is None else ", ".join(f"{x:.2f}" for x in load)


def _validation_lines(check: dict | None) -> list[str]:
    if not check:
        return ["", "No CPU validation recorded yet (`research/roofline/roofline.py --validate`)."]
    rates, machine = check["rates"], check["machine"]
    lines = ["", f"Machine: {machine['cpu']}, {machine['cores']} cores, torch {check['threads']} threads, "
             f"load average (1, 5, 15 min) {_load(machine.get('load_before'))} before and "
             f"{_load(machine['load'])} after the run (CPU features: {machine.get('cpu_features', '?')}). "
             f"Measured rates ({rates['source']}): GEMM {rates['gemm'] / 1e9:.1f} GFLOP/s, attention "
             f"{rates['attention'] / 1e9:.1f} GFLOP/s, copy {rates['bandwidth'] / 1e9:.1f} GB/s.", "",
             "| method | prompt tokens | measured TTFT (s) | predicted (s) | error |", "|---|---|---|---|---|"]
    for r in check["rows"]:
        lines.append(f"| {r['method']} | {r['prompt_tokens']} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | "
                     f"{100 * r['error']:+.0f}% |")
    worst = max(abs(r["error"]) for r in check["rows"])
    verdict = ("**Validated: every prediction within 25% of the measured TTFT** (worst " if worst <= 0.25 else
               "**Not validated: the worst prediction misses by more than 25%** (worst ")
    return lines + ["", verdict + f"{100 * worst:.0f}%). The load average above says whether the run had the "
                    "cores to itself; element-wise work (norms, RoPE, activations, cache copies) is not priced."]


def _plot(result: dict, path: Path) -> Path:
    plt = _pyplot()
    rows = [r for r in result["table"] if r["model"] == "Llama-3.1-8B"]
    devices = list(dict.fromkeys(r["device"] for r in rows))
    fig, axes = plt.subplots(1, len(devices), figsize=(5 * len(devices), 4.2), sharey=True)
    for ax, device in zip(axes, devices):
        for method in dict.fromkeys(r["method"] for r in rows):
            points = sorted((r["prompt_tokens"], r["ttft_s"]) for r in rows if r["device"] == device and r["method"] == method)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(device)
        ax.set_xlabel("prompt tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("predicted TTFT (s), roofline bound")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Llama-3.1-8B, bf16: roofline TTFT per method (vendor peak FLOP/s and bandwidth, no GPU measured)")
    return _save(fig, path)


def write_report(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "roofline.json", out / "roofline.md"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# What a GPU user should expect: roofline TTFT per method", "",
             "Model: evaluation/roofline.py (each part max(FLOPs / peak, bytes / bandwidth); element-wise work "
             "and launch gaps not priced, so these are lower bounds; speed-ups are ratios of bounds). "
             "H2O at its defaults (S=1024, L=H=256, dense tail 64); SpecPrefill keep 0.1, look-ahead 8, "
             "self:K = the model's first quarter of layers. No GPU was measured.", "",
             "| device | peak (dense 16-bit) | bandwidth | source |", "|---|---|---|---|"]
    for device in result["devices"].values():
        lines.append(f"| {device['name']} | {device['gemm'] / 1e12:.1f} TFLOP/s | {device['bandwidth'] / 1e9:.0f} GB/s "
                     f"| {device['source']} |")
    lines += _table_lines(result["table"])
    lines += ["", "## Published anchors", "", "| anchor | their setting | modelled here | published | predicted |",
              "|---|---|---|---|---|"]
    for a in result["anchors"]:
        lines.append(f"| {a['anchor']} | {a['setting']} | {a['modelled']} | {a['published']}x | {a['predicted']:.1f}x |")
    lines += ["", "## The model on this CPU (torch, fp32, demo model SmolLM2-135M)"] + _validation_lines(result.get("validation"))
    md_path.write_text("\n".join(lines) + "\n")
    return [json_path, md_path, _plot(result, out / "roofline.png")]
