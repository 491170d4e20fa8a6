"""Compile every Triton kernel configuration the dispatchers can choose, for every listed GPU, here.

    .venv/bin/python scripts/aot_matrix.py                      # full matrix -> results/gpu/aot/
    .venv/bin/python scripts/aot_matrix.py --arch 89 --kernel scoring --out /tmp/aot

No GPU is needed: Triton's compiler and bundled ptxas build each cubin for GPUTarget("cuda", cc, 32)
(backends/torch_cuda/kernels/aot.py). A cell fails when it does not compile, spills registers, or
asks more shared memory than its target gives a block; the exit code is 1 when any cell fails.
Compiles are cached by Triton (~/.triton/cache), so a re-run recompiles only changed cells.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its warning

from specfill.backends.torch_cuda.kernels.aot import all_cells, compile_cell  # noqa: E402
from specfill.backends.torch_cuda.kernels.tiles import ARCH_LIMITS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch",
        type=int,
        action="append",
        choices=sorted(ARCH_LIMITS),
        help="target compute capability x10 (repeatable; default: all)",
    )
    parser.add_argument(
        "--kernel",
        action="append",
        choices=("forward", "colsum", "scoring", "prefill", "prefill-tma", "prefill-tma-wide"),
        help="kernel (repeatable; default: all)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu" / "aot")
    return parser.parse_args(argv)


def _markdown(rows: list[dict], meta: dict) -> str:
    failed = [row for row in rows if row["failures"]]
    lines = [
        f"# Triton kernels compiled ahead of time for {len(meta['targets'])} GPU targets",
        "",
        f"`{meta['command']}` on {meta['machine']} (no GPU; Triton {meta['triton']}, its bundled "
        f"ptxas), {meta['seconds']:.0f} s under load {meta['load']}.",
        "",
        f"**{len(rows)} cells, {len(failed)} failures, {meta['spills']} with register spills.** "
        "A cell is one kernel x dtype x head dim x mask (flash kernels: block-diagonal or full) "
        "or rows class (scoring: G x n_q up to 16/32/64) or lower-right causal (prefill; prefill-tma: "
        "its tensor-descriptor twin, sm_90 only; prefill-tma-wide: that twin with 128 x 128 tiles) x target, "
        "compiled with the tiles the "
        "dispatcher picks there (backends/torch_cuda/kernels/tiles.py). Resident blocks per SM "
        "follow the per-arch limits of the CUDA C++ Programming Guide (cited in tiles.py).",
        "",
        "| cell | BLOCK_M x BLOCK_N | warps | stages | regs | spill B | smem KB | blocks/SM | bound by | failures |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['cell']} | {row['block_m']}x{row['block_n']} | {row['num_warps']} | "
            f"{row['num_stages']} | {row.get('registers', '-')} | "
            f"{row.get('spill_bytes', 0) + row.get('stack_bytes', 0)} | "
            f"{row.get('shared_bytes', 0) / 1024:.1f} | {row.get('resident_blocks', '-')} | "
            f"{row.get('bound_by', '-')} | {'; '.join(row['failures']) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    import triton

    args = _parse(argv)
    archs = tuple(args.arch or ARCH_LIMITS)
    cells = [c for c in all_cells(archs) if not args.kernel or c.kernel in args.kernel]
    start, rows = time.perf_counter(), []
    for number, cell in enumerate(cells, 1):
        rows.append(compile_cell(cell))
        status = "; ".join(rows[-1]["failures"]) or "ok"
        print(f"[{number}/{len(cells)}] {cell.label()}: {status}", flush=True)
    meta = {
        "command": "python scripts/" + " ".join([Path(__file__).name, *(argv or sys.argv[1:])]),
        "machine": _machine(),
        "triton": triton.__version__,
        "targets": list(archs),
        "seconds": time.perf_counter() - start,
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "failures": sum(bool(row["failures"]) for row in rows),
        "spills": sum(bool(row.get("spill_bytes") or row.get("stack_bytes")) for row in rows),
        "by_kernel": dict(Counter(row["kernel"] for row in rows)),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "aot_matrix.json").write_text(json.dumps({"meta": meta, "cells": rows}, indent=1) + "\n")
    (args.out / "aot_matrix.md").write_text(_markdown(rows, meta))
    print(f"{len(rows)} cells, {meta['failures']} failures, {meta['spills']} spills -> {args.out}")
    return 1 if meta["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
