"""research/peers/results/peers.{json,md,png} from research/peers/peer_table.py's rows."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specfill.evaluation.machine import describe_machine, machine_line

REFERENCE = "cuda:full"  # first tokens are compared with specfill torch full prefill's


def _label(system: str) -> str:
    names = {"llama.cpp": "llama.cpp (llama-cpp-python)", "mlx-lm": "mlx-lm (MLX CPU)"}
    if system in names:
        return names[system]
    backend, method = system.split(":")
    return f"specfill {'torch' if backend == 'cuda' else 'mlx'} {method}"


def markdown(rows: list[dict[str, Any]], options: Any, machine: dict) -> str:
    lines = [f"# Peers: TTFT on {Path(options.gguf).name}", "",
             f"Machine: {machine_line(machine)}. Same prompt token ids for every system (the fixed evaluation "
             f"text); SpecPrefill keep 0.1 with {Path(options.speculator).name} as speculator; H2O at its defaults. "
             "Each system in its own process, one after another; TTFT after one 256-token warm-up.", "",
             "| system | dtype | prompt tokens | TTFT (s) | vs specfill torch full | kept | first 8 tokens = torch full's | load before / after |",
             "|---|---|---|---|---|---|---|---|"]
    for n in dict.fromkeys(r["prompt_tokens"] for r in rows):
        group = [r for r in rows if r["prompt_tokens"] == n]
        ref = next((r for r in group if r["system"] == REFERENCE and "ttft_s" in r), None)
        for r in group:
            if "skipped" in r:
                lines.append(f"| {_label(r['system'])} | - | {n} | skipped: {r['skipped']} | | | | |")
                continue
            ratio = f"{ref['ttft_s'] / r['ttft_s']:.2f}x" if ref else "-"
            same = "-" if ref is None else ("yes" if r["first_tokens"] == ref["first_tokens"] else
                                            f"no ({sum(a == b for a, b in zip(r['first_tokens'], ref['first_tokens']))}/8)")
            lines.append(f"| {_label(r['system'])} | {r['dtype']} | {n} | {r['ttft_s']:.2f} | {ratio} | {r['kept']} | "
                         f"{same} | {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    lines += ["", "A speed-up is TTFT of specfill torch full over the system's (above 1: faster). 'First tokens' "
              "compares the greedy continuation: the sparse methods may differ by design; llama.cpp runs the Q4_K_M "
              "weights as stored, the others dequantized to float32, so their logits differ by quantization."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], options: Any, machine: dict, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    done = [r for r in rows if "ttft_s" in r]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(done) + 1.5))
    labels = [f"{_label(r['system'])} @ {r['prompt_tokens']}" for r in done]
    bars = ax.barh(labels, [r["ttft_s"] for r in done], color="tab:blue")
    ax.bar_label(bars, fmt="%.1f s", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("TTFT (s), lower is better")
    threads = machine.get("cores")
    ax.set_title(f"{Path(options.gguf).name}: TTFT by system\n(float32 unless llama.cpp Q4_K_M), "
                 f"CPU {machine['cpu']}, {threads} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(rows: list[dict[str, Any]], options: Any, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine()
    json_path, md_path = out / "peers.json", out / "peers.md"
    json_path.write_text(json.dumps({"model": Path(options.gguf).name, "speculator": Path(options.speculator).name,
                                     "machine": machine, "rows": rows}, indent=1) + "\n")
    md_path.write_text(markdown(rows, options, machine))
    png = plot(rows, options, machine, out / "peers.png")
    return [json_path, md_path] + ([png] if png else [])
