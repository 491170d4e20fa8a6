"""The architectures x methods table of docs/models.md, generated from the adapter tests' own set.

Each row is an architecture the adapter tests build and run on MLX: which layer kinds the adapter
found, and per method either "tested" (the test that checks it: forward = equal to mlx-lm's own
forward and decoding; oracle = H2O memory sets / SpecPrefill kept positions equal to the NumPy
oracle's; greedy = drafting gives the greedy tokens) or the refusal the tests expect. Hybrids
(recurrent layers beside attention) are checked by test_mlx_hybrids.py: the methods on their
attention layers, drafting with the recurrent state rolled back.

    .venv/bin/python -m tests.adapters.mlx_table --write    # rewrite the table in docs/models.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from specfill.backends.mlx.adapted import adapt
from specfill.core.errors import ModelLoadError
from tests.adapters.mlx_archs import HONOURED, HYBRID, MOE, REFUSED, build

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
BEGIN, END = (
    "<!-- adapter-table:begin (generated: python -m tests.adapters.mlx_table --write) -->",
    "<!-- adapter-table:end -->",
)
MOE_ELSEWHERE = (
    "deepseek_v3",
    "qwen3_next",
    "qwen3_5_moe",
    "nemotron_h",
    "granitemoehybrid",
    "jamba",
    "kimi_linear",
)  # mixtures of experts among the refused and hybrids
OWN = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


def _row(arch: str) -> str:
    moe = "yes" if arch in MOE or arch in MOE_ELSEWHERE else ""
    try:
        args = adapt(build(arch)).args
    except ModelLoadError as err:  # "<arch> layer <i> is <kind>: <why>"
        kind = str(err).split(" is ", 1)[1].split(" (parts")[0]
        reason = str(err)[len(arch) + 1 :]
        return f"| {arch} | {moe} | {kind} | refused | refused | refused | refused | at load: {reason} |"
    kinds = ", ".join(sorted({layer.kind for layer in args.layers}))
    h2o, main, speculator = (args.refusal(method) for method in ("h2o", "specprefill", "speculator"))
    columns = " | ".join("oracle" if refusal is None else "refused" for refusal in (h2o, main))
    reason = h2o or main or (f"as SpecPrefill's speculator: {speculator}" if speculator else "")
    return f"| {arch} | {moe} | {kinds} | forward | greedy | {columns} | {reason} |"


def table() -> str:
    """The markdown table (with its markers) for the architectures the adapter tests run."""
    rows = [_row(arch) for arch in sorted(HONOURED) + sorted(REFUSED) + sorted(HYBRID)]
    own = ", ".join(OWN)
    return "\n".join(
        [
            BEGIN,
            "| mlx-lm architecture | MoE | layer kinds | full prefill + decode | drafting | H2O | "
            "SpecPrefill | refused because |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Own model files ({own}): every method, and greedy tokens equal to the adapter's under "
            f"full, H2O and SpecPrefill (test_own_families.py).",
            END,
        ]
    )


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    updated = text[:start] + table() + text[stop:]
    if "--write" in argv:
        DOC.write_text(updated)
    return 0 if updated == text or "--write" in argv else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
