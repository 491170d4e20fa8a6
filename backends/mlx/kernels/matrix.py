"""Every Metal kernel, for every dtype and shape class its dispatcher can pick, against its twin.

The Metal kernels are templated on the input dtype (InT), the head dim (D) and the GQA group (G):
each (stage, dtype, D, G) is a separate Metal library, and the first-use self-check's shape class
is exactly (D, G). A cell runs one stage with the kernel forced (`use_kernel=True`) and with the
MLX-ops twin on a seeded case whose sizes cross the kernels' edges (a partial chunk, memory sets
longer than a threadgroup, prompts not a multiple of anything), and compares the outputs.

Run by `specfill doctor` on a Mac (real Metal: MSL compilation, the GPU's maths and the pipeline's
threadgroup limits, the things only a Mac can check) and by scripts/metal_matrix.py here, through
the C++ emulation of the kernel sources (tests/mlx_kernels/metal_emulator.py).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from .inter import inter_attention
from .intra import intra_attention
from .scoring import attention_scores

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
HEAD_DIMS = (64, 80, 96, 128, 256)
GROUPS = (1, 4, 7)  # no GQA, Llama 3's group, an odd group (Qwen2.5 0.5B)
STAGES = ("intra", "inter", "scoring")
# o (input dtype) may differ by about one rounding of the stored value; fp32 statistics and
# probabilities by summation order and exp() ulps
OUTPUT_TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
STATS_TOLERANCE = 1e-4
KV_HEADS = 2


class MetalCell(NamedTuple):
    stage: str
    dtype: str
    head_dim: int
    group: int

    def label(self) -> str:
        return f"{self.stage} {self.dtype} D={self.head_dim} G={self.group}"


def metal_cells(head_dims=HEAD_DIMS, groups=GROUPS, dtypes=tuple(DTYPES)) -> list[MetalCell]:
    return [MetalCell(s, d, h, g) for s in STAGES for d in dtypes for h in head_dims for g in groups]


def _arrays(cell: MetalCell, *shapes: tuple[int, ...]) -> list[mx.array]:
    rng = np.random.default_rng(cell.head_dim * 31 + cell.group)
    return [mx.array(rng.standard_normal(s).astype(np.float32)).astype(DTYPES[cell.dtype]) for s in shapes]


def _outputs(cell: MetalCell, use_kernel: bool) -> dict[str, mx.array]:
    """The stage's outputs on the cell's case: intra T=40 in chunks of 16 (a partial chunk);
    inter 24 queries over 70 memory slots; scoring 2 layers x 3 queries over 50 keys."""
    heads, dim, scale = KV_HEADS * cell.group, cell.head_dim, cell.head_dim**-0.5
    if cell.stage == "scoring":
        queries, keys = _arrays(cell, (2, 3, heads, dim), (2, KV_HEADS, 50, dim))
        return {"probs": attention_scores(queries, keys, scale, use_kernel=use_kernel)}
    if cell.stage == "intra":
        q, k, v = _arrays(cell, (heads, 40, dim), (KV_HEADS, 40, dim), (KV_HEADS, 40, dim))
        result = intra_attention(q, k, v, 16, scale, use_kernel=use_kernel)
    else:
        q, k, v = _arrays(cell, (heads, 24, dim), (KV_HEADS, 70, dim), (KV_HEADS, 70, dim))
        result = inter_attention(q, k, v, scale, use_kernel=use_kernel)
    return {"m": result.state.m, "l": result.state.l, "o": result.state.o, "colsum": result.colsum}


def _error(got: mx.array, want: mx.array) -> float:
    """max |got - want| / max(1, max |want|), in float64; inf when shapes or finiteness differ."""
    a, b = (np.asarray(x.astype(mx.float32), dtype=np.float64) for x in (got, want))
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def check_metal_cell(cell: MetalCell) -> dict[str, Any]:
    """{"cell", "errors", "failures", "seconds"}: the forced kernel against the twin; a compile or
    launch error is the cell's failure."""
    start = time.perf_counter()
    row: dict[str, Any] = {"cell": cell.label(), **cell._asdict(), "errors": {}, "failures": []}
    try:
        got = _outputs(cell, True)
        mx.eval(*got.values())
    except Exception as error:  # noqa: BLE001 - the kernel's own error is the finding
        row["failures"].append(f"compile or launch: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        row["seconds"] = time.perf_counter() - start
        return row
    want = _outputs(cell, False)
    for name, value in got.items():
        error = _error(value, want[name])
        row["errors"][name] = error
        limit = OUTPUT_TOLERANCE[cell.dtype] if name == "o" else STATS_TOLERANCE
        if not error <= limit:
            row["failures"].append(f"{name}: error {error:.2e} over {limit:.0e}")
    row["seconds"] = time.perf_counter() - start
    return row


def run_metal_matrix(cells: list[MetalCell] | None = None, log=None) -> dict[str, Any]:
    """Every cell; {"cells": rows, "failures": count, "device": MLX's default device}."""
    rows = []
    for number, cell in enumerate(cells if cells is not None else metal_cells(), 1):
        rows.append(check_metal_cell(cell))
        if log is not None:
            log(f"[{number}] {cell.label()}: {'; '.join(rows[-1]['failures']) or 'ok'}")
    return {"device": str(mx.default_device()), "cells": rows, "failures": sum(bool(r["failures"]) for r in rows)}
