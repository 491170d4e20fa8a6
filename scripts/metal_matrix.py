"""Every Metal kernel x dtype x head dim x GQA group against its twin, without a Mac.

    .venv/bin/python scripts/metal_matrix.py          # -> results/gpu/metal/metal_matrix.{json,md}

The kernel sources run through the C++ emulation (tests/mlx_kernels/metal_emulator.py: g++, one
library per template instantiation, bounds-checked buffers); the cells and their comparison are
backends/mlx/kernels/matrix.py, which `specfill doctor` runs on real Metal on a Mac. Exit code 1
when any cell fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mlx_kernels"))

from metal_emulator import EmulatedKernel  # noqa: E402

from specfill.backends.mlx.kernels import dispatch, inter, intra, matrix, scoring  # noqa: E402

ONLY_A_MAC = [
    "MSL compilation of each source for each (InT, D, G) instantiation (the emulation compiles C++)",
    "Metal's maths on the GPU: fast-math exp(), half and bfloat rounding in hardware",
    "the pipeline's threadgroup limit: 64 threads each holding 2 x D floats of private arrays "
    "(D = 256: 2 KB) must fit the compiled pipeline's maxTotalThreadsPerThreadgroup",
    "speed",
]


def emulate_metal() -> None:
    """Route the three kernel builders through the C++ emulator and report Metal as present."""
    dispatch.metal_available = lambda: True
    intra._make_intra_kernel = lambda: (
        EmulatedKernel(**intra.INTRA_ATTENTION_SPEC),
        EmulatedKernel(**intra.INTRA_COLSUM_SPEC),
    )
    inter._make_inter_kernel = lambda: (
        EmulatedKernel(**inter.INTER_ATTENTION_SPEC),
        EmulatedKernel(**inter.INTER_COLSUM_SPEC),
    )
    scoring._make_scoring_kernel = lambda: (
        EmulatedKernel(**scoring.SCORING_STATS_SPEC),
        EmulatedKernel(**scoring.SCORING_PROBS_SPEC),
    )


def _markdown(result: dict) -> str:
    cells = result["cells"]
    lines = [
        "# Metal kernels against their MLX-ops twins, through the C++ emulation",
        "",
        f"`python scripts/metal_matrix.py` on {result['machine']} (no Mac), {result['seconds']:.0f} s, load "
        f"{result['load']}. **{len(cells)} cells, {result['failures']} failures.** A cell is one stage "
        "(intra: attention + column sums; inter: the same over a memory set; scoring: row statistics + "
        "probabilities) x input dtype x head dim D x GQA group G: every template instantiation class the "
        "dispatchers can pick (backends/mlx/kernels/matrix.py). Error: max |kernel - twin| / max(1, max |twin|); "
        f"limits: o {matrix.OUTPUT_TOLERANCE}, statistics and probabilities {matrix.STATS_TOLERANCE}.",
        "",
        "Only a Mac can check (`specfill doctor --backend mlx` runs this matrix on Metal there): "
        + "; ".join(ONLY_A_MAC)
        + ".",
        "",
        "| cell | errors | result |",
        "|---|---|---|",
    ]
    for row in cells:
        errors = ", ".join(f"{k} {v:.1e}" for k, v in row["errors"].items())
        lines.append(f"| {row['cell']} | {errors} | {'; '.join(row['failures']) or 'ok'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu" / "metal")
    args = parser.parse_args(argv)
    emulate_metal()
    start = time.perf_counter()
    result = matrix.run_metal_matrix(log=lambda line: print(line, flush=True))
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    result.update(
        seconds=time.perf_counter() - start,
        machine=f"{cpu}, {os.cpu_count()} cores",
        load=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        only_a_mac=ONLY_A_MAC,
        emulation="tests/mlx_kernels/metal_emulator.py (g++)",
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metal_matrix.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "metal_matrix.md").write_text(_markdown(result))
    print(f"{len(result['cells'])} cells, {result['failures']} failures -> {args.out}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
