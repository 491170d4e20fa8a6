"""The model types x methods table of docs/models.md (torch backend), generated from the
transformers adapter tests' own set.

Each row is a transformers model type the adapter tests build and run on torch: which attention
modules the adapter found, and per method either "tested" (the test that checks it: forward =
equal to transformers' own forward and decoding; oracle = H2O memory sets / SpecPrefill kept
positions equal to the NumPy oracle's; greedy = drafting gives the greedy tokens) or the refusal
the tests expect. A hybrid's rows (HYBRID: test_torch_hybrids.py) check the methods on its attention
layers; its recurrent layers run as transformers' own.

    .venv/bin/python -m tests.adapters.torch_table --write    # rewrite the table in docs/models.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from specfill.backends.torch_cuda.adapted import adapt
from specfill.core.errors import ModelLoadError
from tests.adapters.torch_archs import AT_LOAD, HONOURED, HYBRID, MOE, REFUSED, build

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
BEGIN, END = (
    "<!-- torch-adapter-table:begin (generated: python -m tests.adapters.torch_table --write) -->",
    "<!-- torch-adapter-table:end -->",
)
# mixtures of experts among the refused ones
MOE_ELSEWHERE = (
    "deepseek_v3",
    "qwen3_next",
    "llama4_text",
    "qwen3_5_moe_text",
    "minimax",
    "nemotron_h",
    "granitemoehybrid",
    "kimi_linear",
    "jamba",
)


def _row(arch: str) -> str:
    moe = "yes" if arch in MOE or arch in MOE_ELSEWHERE else ""
    try:
        args = adapt(build(arch)).args
    except ModelLoadError as err:  # "<arch> layer <i> is <kind> (...): <why>"
        kind = AT_LOAD[arch][1]
        why = str(err)[len(arch) + 1 :]
        return f"| {arch} | {moe} | {kind} | refused | refused | refused | refused | at load: {why} |"
    kinds = ", ".join(
        sorted({layer.kind + (" beside a recurrent mixer" if layer.parallel else "") for layer in args.layers})
    )
    refusal = args.refusal()
    h2o, spec = ("oracle", "oracle") if refusal is None else ("refused", "main pass: oracle; as speculator: refused")
    return f"| {arch} | {moe} | {kinds} | forward | greedy | {h2o} | {spec} | {refusal or ''} |"


def table() -> str:
    """The markdown table (with its markers) for the model types the adapter tests run."""
    rows = [_row(arch) for arch in sorted(HONOURED) + sorted(REFUSED) + sorted(HYBRID) + sorted(AT_LOAD)]
    return "\n".join(
        [
            BEGIN,
            "| transformers model type | MoE | layer kinds | full prefill + decode | drafting | H2O | "
            "SpecPrefill | refused because |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
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
