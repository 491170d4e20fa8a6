"""How fast can SpecPrefill and the composition make an agent's next turn (a new part over a cached
prefix), by the roofline model, and does it explain the pair's measured turns?

    .venv/bin/python research/agent_turns/agent_turns_roofline.py   # -> research/agent_turns/results/

Prices (evaluation/roofline.predict with `prefix`): full prefill of the new part over the prefix;
SpecPrefill from a reused prefix (the speculator prefills the new part over its own cached KV, keeps
a share of the new part, the main model prefills the kept tokens over the prefix); the composition
(the speculator's new part walked by H2O from the prefix: its first chunk reads the whole prefix, the
later chunks a memory set). Two rate sets: "FLOP-bound" (GEMM and attention at one rate, no memory
limit: the shape of a CPU run) and H100 vendor peaks. Beside them, the measured turns of
results/agent_session/agent_turns_pair.json (the pair, float32, 2 threads, an AVX2 EPYC).

Finding it is for: the 0.5B speculator's attention (14 query heads of 64 against the 1.5B's 12 of
128, 24 layers against 28) costs 0.36-0.43 of the 1.5B's full prefill once the context is 10-30K
tokens, so SpecPrefill over a cached prefix tops out near 1.5x on the pair however little it keeps;
H2O in the speculator removes most of that attention.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from specfill.core.config import AUTO_COMPOSITION, speculator_h2o
from specfill.evaluation.roofline import DEVICES, Method, Rates, Shape, predict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "roofline"))  # the sibling study's shapes
from roofline import LLAMA_1B, LLAMA_8B, QWEN_CODER_05B, QWEN_CODER_15B  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MEASURED = ROOT / "results" / "agent_session" / "agent_turns_pair.json"
FLOP_BOUND = Rates("FLOP-bound (one rate, no memory limit)", 1e12, 1e12, 1e18, "GEMM = attention rate")
PAIRS = ((QWEN_CODER_15B, QWEN_CODER_05B), (LLAMA_8B, LLAMA_1B))
PREFIXES = (8192, 18432, 32768)  # a system prompt with tool schemas (Claude Code's ~18K) and a longer conversation
NEW = (2048, 4096, 8192, 16384)  # a tool result
KEEP = 0.3  # SpecPrefill's default share
AUTO_SHARE = 0.17  # what AUTO_COMPOSITION (keep 0.1, one neighbour chunk) kept of the 16K proxy's prompts


def methods(speculator: Shape) -> dict[str, Method]:
    h2o = speculator_h2o()
    return {
        "specprefill keep 0.3": Method("specprefill", speculator=speculator, keep=KEEP),
        "composition keep 0.3": Method("specprefill", speculator=speculator, keep=KEEP, speculator_h2o=h2o),
        f"composition as auto's ({AUTO_SHARE:.0%} kept)": Method(
            "specprefill", speculator=speculator, keep=AUTO_SHARE, speculator_h2o=h2o
        ),
    }


def speedups(main: Shape, speculator: Shape, rates: Rates, prefix: int, new: int) -> dict[str, dict]:
    full = predict(main, rates, new, Method("full"), prefix=prefix)["ttft"]
    out = {}
    for name, method in methods(speculator).items():
        parts = predict(main, rates, new, method, prefix=prefix)
        out[name] = {"speedup": full / parts["ttft"], "speculator_share_of_full": parts["speculator"] / full}
    return out


def grid() -> list[dict]:
    rows = []
    for rates in (FLOP_BOUND, DEVICES["h100"]):
        for main, speculator in PAIRS:
            for prefix in PREFIXES:
                for new in NEW:
                    for name, figures in speedups(main, speculator, rates, prefix, new).items():
                        rows.append(
                            {"rates": rates.name, "pair": f"{main.name} + {speculator.name}", "prefix": prefix,
                             "new": new, "method": name, **figures}
                        )  # fmt: skip
    return rows


def measured() -> list[dict]:
    """The pair's measured turns with the FLOP-bound prediction for the same prefix and new part."""
    if not MEASURED.is_file():
        return []
    runs = json.loads(MEASURED.read_text())["runs"]
    full = {t["turn"]: t for t in runs["full"]["turns"]}
    names = {"specprefill": "specprefill keep 0.3", "composition": "composition keep 0.3"}
    rows = []
    for run, name in names.items():
        for turn in runs.get(run, {}).get("turns", []):
            base = full.get(turn["turn"])
            if base is None:
                continue
            predicted = speedups(
                QWEN_CODER_15B, QWEN_CODER_05B, FLOP_BOUND, turn["cached_tokens"], turn["new_tokens"]
            )[name]
            rows.append(
                {"method": run, "turn": turn["turn"], "prefix": turn["cached_tokens"], "new": turn["new_tokens"],
                 "measured": base["ttft_s"] / turn["ttft_s"], "predicted": predicted["speedup"],
                 "speculator_share_of_full": predicted["speculator_share_of_full"]}
            )  # fmt: skip
    return rows


def write(rows: list[dict], checks: list[dict], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = {"auto_composition": repr(AUTO_COMPOSITION), "grid": rows, "measured": checks}
    paths = [out / "agent_turns_roofline.json", out / "agent_turns_roofline.md", out / "agent_turns_roofline.png"]
    tmp = paths[0].with_suffix(".json.partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, paths[0])
    lines = [
        "# Agent turns by the roofline: a new part over a cached prefix",
        "",
        "Written by research/agent_turns/agent_turns_roofline.py (pure arithmetic: evaluation/roofline.py with a "
        "reused prefix). Speed-up = full prefill of the new part over the prefix / the method's; 'speculator "
        "share' = the speculator's prompt pass as a share of that full prefill.",
        "",
        "## The pair's measured turns against the FLOP-bound prediction",
        "",
        "Measured: results/agent_session/agent_turns_pair.md (float32, 2 threads, AVX2 EPYC; full's turns 1-2 "
        "ran beside niced tests, so their measured ratios are inflated).",
        "",
        "| method | turn | prefix | new | measured | predicted | speculator share of full (predicted) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {c['method']} | {c['turn']} | {c['prefix']} | {c['new']} | {c['measured']:.2f}x | "
            f"{c['predicted']:.2f}x | {c['speculator_share_of_full']:.2f} |"
            for c in checks
        ),
        "",
        "## Predicted speed-ups",
        "",
        "| rates | pair | prefix | new | method | speed-up | speculator share of full |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['rates']} | {r['pair']} | {r['prefix']} | {r['new']} | {r['method']} | {r['speedup']:.2f}x | "
            f"{r['speculator_share_of_full']:.2f} |"
            for r in rows
        ),
    ]
    tmp = paths[1].with_suffix(".md.partial")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, paths[1])
    _plot(rows, paths[2])
    return paths


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({r["pair"] for r in rows})
    rows = [r for r in rows if r["rates"] == FLOP_BOUND.name]
    fig, axes = plt.subplots(1, len(pairs), figsize=(6.5 * len(pairs), 4.6), sharey=True)
    for ax, pair in zip(axes, pairs):
        for (method, prefix), style in zip(
            [(m, p) for m in methods(QWEN_CODER_05B) for p in PREFIXES], ["-", "--", ":"] * len(methods(QWEN_CODER_05B))
        ):
            points = [
                (r["new"], r["speedup"])
                for r in rows
                if r["pair"] == pair and r["method"] == method and r["prefix"] == prefix
            ]
            colour = {name: f"C{i}" for i, name in enumerate(methods(QWEN_CODER_05B))}[method]
            ax.plot(*zip(*points), style, color=colour, marker="o", label=f"{method}, prefix {prefix // 1024}K")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens (over the cached prefix)")
        ax.set_title(pair, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speed-up vs full prefill of the new part")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Agent turns by the roofline: FLOP-bound rates (a CPU's shape), bf16/fp32 alike, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    for path in write(grid(), measured(), HERE / "results"):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
