"""roofline.json, roofline.md and roofline.png from research/roofline/roofline.py's result."""
from __future__ import annotations

import json
from pathlib import Path

from specfill.evaluation.plots import _pyplot, _save
from specfill.evaluation.ruler_protocol import write_atomic


def _table_lines(rows: list[dict], bold: str = "") -> list[str]:
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
                mark = "**" if bold and method.startswith(bold) else ""
                lines.append(f"| {mark}{method}{mark} | " + " | ".join(
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
    write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    lines = ["# What a GPU user should expect: roofline TTFT per method", "",
             "Model: evaluation/roofline.py (each part max(FLOPs / peak, bytes / bandwidth); element-wise work "
             "and launch gaps not priced, so these are lower bounds; speed-ups are ratios of bounds). "
             "H2O at its defaults (S=1024, L=H=256, dense tail 64) in every layer ('all layers') or in the "
             "default first third ('first-0.33'); SpecPrefill keep 0.1, look-ahead 8, self:K = the model's "
             "first quarter of layers; '+ H2O speculator' = the composition (issue 38): the speculator's "
             "prompt pass runs H2O (defaults, all layers), look-ahead and scoring unchanged, the main model "
             "prefills the kept tokens dense. No GPU was measured.", "",
             "| device | peak (dense 16-bit) | bandwidth | source |", "|---|---|---|---|"]
    for device in result["devices"].values():
        lines.append(f"| {device['name']} | {device['gemm'] / 1e12:.1f} TFLOP/s | {device['bandwidth'] / 1e9:.0f} GB/s "
                     f"| {device['source']} |")
    lines += _table_lines(result["table"])
    lines += ["", "## Published anchors", "", "| anchor | their setting | modelled here | published | predicted |",
              "|---|---|---|---|---|"]
    for a in result["anchors"]:
        lines.append(f"| {a['anchor']} | {a['setting']} | {a['modelled']} | {a['published']}x | {a['predicted']:.1f}x |")
    lines += _composition_lines(result)
    lines += ["", "## The model on this CPU (torch, fp32, demo model SmolLM2-135M)"] + _validation_lines(result.get("validation"))
    write_atomic(md_path, "\n".join(lines) + "\n")
    return [json_path, md_path, _plot(result, out / "roofline.png")]


def _composition_lines(result: dict) -> list[str]:
    if "composition" not in result:
        return []
    lines = ["", "## The composition: SpecPrefill whose speculator prefills with H2O (issue 38)", "",
             f"Per main + speculator pair, keep {' and '.join(sorted({str(a['keep']) for a in result['acceptance'] if a['setting'].startswith('keep')}))} "
             "(0.1: the paper's; 0.3: this project's default); the "
             "speculator's pass priced with h2o_dot_products (H2O defaults in every layer), look-ahead and "
             "scoring over every prompt key, the main model's kept tokens dense. PFlash's published figure "
             "(10.4x at 128K, RTX 3090) is in the anchors above."]
    lines += _table_lines(result["composition"], bold="composition")
    lines += ["", "**Acceptance line of issues 38 and 47: composition >= 6x full at 128K on H100 (roofline)**", "",
              "Keep: the share of the prompt the main model prefills; auto's composition (core/config.py "
              "AUTO_COMPOSITION: keep 0.1 up to 16,384 tokens, then a fixed budget of 1,639 chunk tokens, a "
              "32-query window, one neighbour chunk each side) at its rule's share at 128K times the most its "
              "neighbours can add, 3 (roofline.py auto_share; 1.76-1.88 measured on the 32K proxy; past 32K the "
              "rule is unmeasured).", "",
              "| pair | setting | kept share | predicted speed-up | >= 6x |", "|---|---|---|---|---|"]
    for a in result["acceptance"]:
        lines.append(f"| {a['pair']} | {a.get('setting', 'keep')} | {a['keep']:.3g} | {a['speedup']:.1f}x "
                     f"| {'yes' if a['meets_6x'] else 'no'} |")
    return lines


def write_macs_report(result: dict, out: Path) -> list[Path]:
    """roofline_macs.json and roofline_macs.md: the 70B model over 1, 2 and 4 Mac Studios."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "roofline_macs.json", out / "roofline_macs.md"
    write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    device, link = result["device"], result["link"]
    lines = [f"# {result['model']} at {result['prompt_tokens'] // 1024}K over Mac Studios: roofline TTFT per method",
             "", "Model: evaluation/roofline.py, bf16 weights and cache, each part max(FLOPs / peak, bytes / "
             "bandwidth), lower bounds (element-wise work, launch gaps and the Metal kernels' distance from peak "
             "not priced). Sharded as mlx-lm shards (backends/mlx/distributed.py): tensor = Model.shard (each "
             "Mac a 1/N share of heads and MLP; two ring all-reduces of the step's hidden states per layer, "
             "not overlapped with compute); pipeline = Model.model.pipeline (layers split; mlx-lm hands the "
             "hidden state on and all-gathers every step, so the Macs run one after another: pipeline adds "
             "memory, not speed). The speculator "
             f"({result['speculator']}) is replicated on every Mac (as specfill runs it) and never split. "
             "H2O and the composition's speculator at H2O defaults; SpecPrefill keep 0.1, look-ahead 8. "
             "No Mac was measured.", "",
             "| figure | value | source |", "|---|---|---|",
             f"| {device['name']}: GPU FP16 | {device['gemm'] / 1e12:.1f} TFLOP/s | {device['source']} |",
             f"| {device['name']}: memory | {device['bandwidth'] / 1e9:.0f} GB/s | (same) |",
             f"| {link['name']}: bandwidth | {link['bandwidth'] / 1e9:.0f} GB/s each way, "
             f"latency {link['latency'] * 1e6:.0f} us | {link['source']} |", "",
             "| Macs | sharding | method | TTFT (s) | speed-up vs full on 1 Mac | communication (s) | share |",
             "|---|---|---|---|---|---|---|"]
    for r in result["table"]:
        lines.append(f"| {r['macs']} | {r['kind']} | {r['method']} | {r['ttft_s']:.1f} | "
                     f"{r['speedup_vs_one_mac_full']:.1f}x | {r['communication_s']:.2f} | "
                     f"{100 * r['communication_share']:.0f}% |")
    write_atomic(md_path, "\n".join(lines) + "\n")
    return [json_path, md_path]
