"""Ahead-of-time compilation of the Triton kernels for a named GPU, on a machine without one.

Triton's compiler and its bundled ptxas build a cubin for GPUTarget("cuda", cc, 32) on a CPU;
the bundled cuobjdump reads the cubin's registers per thread and local memory (register spills:
Triton kernels hold no local arrays, so any local memory is spill). Each cell is one kernel x
dtype x head dim x mask x target, compiled with exactly the tiles the dispatcher would pick
there (tiles.py), and judged against that target's limits. scripts/aot_matrix.py runs the full
matrix; tests/torch_cuda_kernels/test_aot.py a few cells.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .dispatch import next_power_of_2
from .tiles import ARCH_LIMITS, Tiles, flash_tiles, prefill_tiles, resident_blocks, scoring_tiles

TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
HEAD_DIMS = (64, 80, 96, 128, 256)
SCORING_ROWS = (16, 32, 64)  # the three BLOCK_R classes: G x n_q up to 16, 32, 64 and above
PREFILL_KERNELS = ("prefill", "prefill-tma", "prefill-tma-wide")  # the attention probe's Triton candidates
# pointer arguments that carry the input dtype; the others are fp32 statistics / outputs
INPUT_POINTERS = {"Q", "K", "V", "O", "Qs", "Ks"}
FP32_POINTERS = {"M", "L", "CS", "Probs", "Stats"}
# arguments a real launch passes as 1 (contiguous last dim), which Triton specialises to constants
UNIT_STRIDES = {"stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_pp"}
# integer arguments a real launch passes as multiples of 16 (Triton marks them divisible by 16)
ALIGNED_INTS = {
    "stride_qh",
    "stride_qt",
    "stride_kh",
    "stride_kt",
    "stride_vh",
    "stride_vt",
    "stride_oh",
    "stride_ot",
    "stride_ql",
    "stride_qq",
    "stride_kl",
    "stride_kp",
    "head_dim",
    "chunk_size",
}


class Cell(NamedTuple):
    """One compile: kernel name, input dtype, head dim, block-diagonal mask (flash kernels) or
    scoring rows class, target capability."""

    kernel: str
    dtype: torch.dtype
    head_dim: int
    variant: int  # flash: 1 block-diagonal / 0 full; scoring: rows (G x n_q) class; prefill: 0
    arch: int

    def tiles(self) -> Tiles:
        block_d = max(16, next_power_of_2(self.head_dim))
        if self.kernel == "scoring":
            return scoring_tiles(self.variant, block_d, self.dtype, self.arch)
        if self.kernel in PREFILL_KERNELS:
            return prefill_tiles(block_d, self.dtype, self.arch, wide=self.kernel == "prefill-tma-wide")
        return flash_tiles(block_d, self.dtype, self.arch)

    def label(self) -> str:
        if self.kernel in PREFILL_KERNELS:
            return f"{self.kernel} {TRITON_TYPES[self.dtype]} d{self.head_dim} lower-right sm_{self.arch}"
        kind = f"rows{self.variant}" if self.kernel == "scoring" else ("blockdiag" if self.variant else "full")
        return f"{self.kernel} {TRITON_TYPES[self.dtype]} d{self.head_dim} {kind} sm_{self.arch}"


def all_cells(archs=tuple(ARCH_LIMITS)) -> list[Cell]:
    """Every configuration the dispatchers can choose, on every target (610 for the 5 targets: the
    TMA prefill kernel on sm_90 only, 16-bit, power-of-2 heads; its wide tiles for heads up to 128)."""
    cells = []
    for arch in archs:
        for dtype in TRITON_TYPES:
            for head_dim in HEAD_DIMS:
                cells += [Cell(k, dtype, head_dim, mask, arch) for k in ("forward", "colsum") for mask in (0, 1)]
                cells += [Cell("scoring", dtype, head_dim, rows, arch) for rows in SCORING_ROWS]
                cells.append(Cell("prefill", dtype, head_dim, 0, arch))
                if arch >= 90 and dtype != torch.float32 and head_dim & (head_dim - 1) == 0:
                    cells.append(Cell("prefill-tma", dtype, head_dim, 0, arch))
                    if head_dim <= 128:
                        cells.append(Cell("prefill-tma-wide", dtype, head_dim, 0, arch))
    return cells


def _kernel_fn(kernel: str):
    if kernel == "scoring":
        from .scoring_triton import _scoring_kernel

        return _scoring_kernel
    if kernel == "prefill":
        from .prefill_triton import _prefill_kernel

        return _prefill_kernel
    if kernel in ("prefill-tma", "prefill-tma-wide"):
        from .prefill_triton import _prefill_tma_kernel

        return _prefill_tma_kernel
    from .flash_triton import _colsum_kernel, _forward_kernel

    return _forward_kernel if kernel == "forward" else _colsum_kernel


def _source(cell: Cell, tiles: Tiles, stats: bool = False):
    """The ASTSource a launch of this cell would build: signature, constants and alignment hints (stats: the
    scoring kernel's first launch, its key ranges' statistics)."""
    fn = _kernel_fn(cell.kernel)
    block_d = max(16, next_power_of_2(cell.head_dim))
    precision = "ieee" if cell.dtype == torch.float32 else "tf32"
    constants = {"PRECISION": precision, "BLOCK_N": tiles.block_n, "BLOCK_D": block_d}
    if cell.kernel == "scoring":
        constants.update(BLOCK_R=tiles.block_m, STATS=stats)
    elif cell.kernel == "prefill":
        constants.update(BLOCK_M=tiles.block_m, HEAD_DIM=cell.head_dim)
    elif cell.kernel in ("prefill-tma", "prefill-tma-wide"):
        constants["BLOCK_M"] = tiles.block_m
        kind = TRITON_TYPES[cell.dtype]
        descriptors = {
            name: f"tensordesc<{kind}[1, {rows}, {block_d}]>"
            for name, rows in (("desc_q", tiles.block_m), ("desc_k", tiles.block_n), ("desc_v", tiles.block_n))
        }
        return _ast_source(
            fn, cell.dtype, constants, UNIT_STRIDES, INPUT_POINTERS, FP32_POINTERS, ALIGNED_INTS, descriptors
        )
    else:
        constants.update(BLOCK_M=tiles.block_m, BLOCK_DIAGONAL=bool(cell.variant))
    return _ast_source(fn, cell.dtype, constants, UNIT_STRIDES, INPUT_POINTERS, FP32_POINTERS, ALIGNED_INTS)


def _ast_source(
    fn, dtype, constants, unit_strides, input_pointers, fp32_pointers, aligned=frozenset(), descriptors=None
):
    """The ASTSource a launch of `fn` builds: `constants` and the unit strides as constexprs,
    pointers typed (input dtype or fp32; `descriptors` may name others, e.g. {"SLOTS": "*i64"}) and
    16-byte aligned, the `aligned` integers marked divisible by 16, `descriptors` {name:
    "tensordesc<bf16[1, 128, 128]>"} as given, qk_scale fp32, other scalars i32."""
    from triton.compiler import ASTSource

    constants = dict(constants)
    signature, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif descriptors and name in descriptors:
            signature[name] = descriptors[name]
        elif name in unit_strides:
            signature[name], constants[name] = "constexpr", 1
        elif name in input_pointers or name in fp32_pointers:
            signature[name] = "*" + ("fp32" if name in fp32_pointers else TRITON_TYPES[dtype])
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name == "qk_scale" else "i32"
            if name in aligned:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """REG / STACK / LOCAL / SHARED of the cubin's one function, from the bundled cuobjdump."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", str(path)], check=True, capture_output=True, text=True
        ).stdout
    function = text.split("Function", 1)[1]
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", function)}


def compile_cell(cell: Cell) -> dict:
    """Compile one cell; a dict of its tiles, resources, residency and failures (empty = valid)."""
    tiles = cell.tiles()
    row = {
        "cell": cell.label(),
        "kernel": cell.kernel,
        "dtype": TRITON_TYPES[cell.dtype],
        "head_dim": cell.head_dim,
        "variant": cell.variant,
        "arch": cell.arch,
        **tiles._asdict(),
    }
    options = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    if cell.kernel != "scoring":
        return _compiled_row(row, lambda: _source(cell, tiles), cell.arch, options)
    # the scoring kernel launches twice (its key ranges' statistics, then the probabilities): both compiled,
    # the row is the one with more registers, with every failure of either
    both = [_compiled_row(dict(row), lambda s=stats: _source(cell, tiles, s), cell.arch, options) for stats in (1, 0)]
    worst = max(both, key=lambda r: r.get("registers", 256))
    return {**worst, "failures": [f"{name}: {f}" for name, r in zip(("stats", "probs"), both) for f in r["failures"]]}


def _compiled_row(row: dict[str, Any], source, arch: int, options: dict[str, int]) -> dict[str, Any]:
    """`row` with the compile of source() for sm_`arch` judged against that target's limits: its
    registers, spills, shared memory, resident blocks and failures (empty = valid)."""
    import triton
    from triton.backends.compiler import GPUTarget

    limits = ARCH_LIMITS[arch]
    try:
        compiled = triton.compile(source(), target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as error:  # the compiler's own error is the finding; keep its first line
        row.update(failures=[f"compile: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"])
        return row
    usage = _resource_usage(compiled.asm["cubin"])
    shared = int(compiled.metadata.shared) + usage.get("SHARED", 0)
    blocks, binding = resident_blocks(limits, usage["REG"], shared, options["num_warps"])
    row.update(
        registers=usage["REG"],
        spill_bytes=usage.get("LOCAL", 0),
        stack_bytes=usage.get("STACK", 0),
        shared_bytes=shared,
        resident_blocks=blocks,
        bound_by=binding,
    )
    failures = []
    if row["spill_bytes"] or row["stack_bytes"]:
        failures.append(
            f"register spill: {row['stack_bytes']} B stack frame + {row['spill_bytes']} B local memory per thread"
        )
    if shared > limits.smem_per_block:
        failures.append(f"shared memory {shared} B over the {limits.smem_per_block} B a block may have")
    if blocks < 1:
        failures.append(f"no block fits on an SM (bound by {binding})")
    row["failures"] = failures
    return row


# the decode kernels' (kernels/decode_triton.py) pointers and the strides a static decode step
# passes as 1 (the cache's, the bias's and the partials' last dimension)
DECODE_INPUT_POINTERS = {"Q", "K", "V", "Bias", "Out"}
DECODE_FP32_POINTERS = {"O", "M", "L"}  # the splits' partial outputs, maxima and sums
DECODE_UNIT_STRIDES = {"stride_qd", "stride_kd", "stride_vd", "stride_bn", "stride_od", "stride_xd"}


def compile_decode(dtype: torch.dtype, head_dim: int, rows: int, arch: int) -> list[dict]:
    """Compile the split and merge decode kernels as a GPU launch of `rows` folded query rows per KV
    head would (decode_triton's GPU tiles, MAX_SPLITS splits); a dict per kernel as compile_cell's."""
    from .decode_triton import MAX_SPLITS, MERGE_SPLITS_PER_STEP, _merge_kernel, _split_kernel, gpu_tiles, row_block

    block_d = max(16, next_power_of_2(head_dim))
    block_n, warps, stages = gpu_tiles(dtype)
    shared = {"BLOCK_DV": block_d}
    kernels = {
        "decode-split": (
            _split_kernel,
            {
                "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
                "BLOCK_R": row_block(rows),
                "BLOCK_N": block_n,
                "BLOCK_D": block_d,
                **shared,
            },
            {"num_warps": warps, "num_stages": stages},
        ),
        "decode-merge": (
            _merge_kernel,
            {"BLOCK_S": MAX_SPLITS, "SPLITS_PER_STEP": MERGE_SPLITS_PER_STEP, **shared},
            {"num_warps": 4, "num_stages": 1},
        ),
    }
    out = []
    for name, (fn, constants, options) in kernels.items():
        row: dict[str, Any] = {
            "cell": f"{name} {TRITON_TYPES[dtype]} d{head_dim} rows{rows} sm_{arch}",
            "kernel": name,
            "arch": arch,
        }
        source = partial(
            _ast_source, fn, dtype, constants, DECODE_UNIT_STRIDES, DECODE_INPUT_POINTERS, DECODE_FP32_POINTERS
        )
        out.append(_compiled_row(row, source, arch, options))
    return out


def compile_rotary(dtype: torch.dtype, head_dim: int, n_heads: int, arch: int) -> dict:
    """Compile the rotary kernel (kernels/rope_triton.py) as rope_triton.rotary launches it for
    `n_heads` heads of `head_dim` (its block of heads, 4 warps, FMA contraction off); a dict as
    compile_cell's."""
    from .rope_triton import LAUNCH_OPTIONS, _rotary_kernel, launch_constants

    constants = launch_constants(n_heads, head_dim)
    row: dict[str, Any] = {
        "cell": f"rotary {TRITON_TYPES[dtype]} d{head_dim} heads{n_heads} sm_{arch}",
        "kernel": "rotary",
        "arch": arch,
    }
    source = partial(_ast_source, _rotary_kernel, dtype, constants, set(), {"X", "COS", "SIN", "O"}, set())
    return _compiled_row(row, source, arch, {**LAUNCH_OPTIONS, "num_stages": 1})


def compile_rotary_store(dtype: torch.dtype, head_dim: int, n_heads: int, n_kv: int, arch: int) -> dict:
    """Compile the rotary-and-store kernel (kernels/rope_triton.py) as rope_triton.rotary_store launches it
    in a static decode step (the step's slots tensor) for `n_heads` query and `n_kv` KV heads of
    `head_dim`; a dict as compile_cell's."""
    from .rope_triton import LAUNCH_OPTIONS, _rotary_store_kernel, launch_constants

    constants = {**launch_constants(n_heads + 2 * n_kv, head_dim), "USE_SLOTS": True}
    row: dict[str, Any] = {
        "cell": f"rotary_store {TRITON_TYPES[dtype]} d{head_dim} heads{n_heads}/{n_kv} sm_{arch}",
        "kernel": "rotary_store",
        "arch": arch,
    }
    pointers = {"X", "V", "COS", "SIN", "O", "KC", "VC"}
    source = partial(
        _ast_source, _rotary_store_kernel, dtype, constants, set(), pointers, set(), descriptors={"SLOTS": "*i64"}
    )
    return _compiled_row(row, source, arch, {**LAUNCH_OPTIONS, "num_stages": 1})


def compile_norm(dtype: torch.dtype, width: int, residual: bool, arch: int) -> dict:
    """Compile the RMSNorm kernel (kernels/norm_triton.py) as norm_triton.rms_norm launches it for rows of
    `width` (with the residual add or without); a dict as compile_cell's."""
    from .norm_triton import _rms_norm_kernel, row_launch

    block, warps = row_launch(width)
    row: dict[str, Any] = {
        "cell": f"rms_norm {TRITON_TYPES[dtype]} n{width}{' +residual' if residual else ''} sm_{arch}",
        "kernel": "rms_norm",
        "arch": arch,
    }
    constants = {"HAS_RESIDUAL": residual, "BLOCK": block}
    source = partial(_ast_source, _rms_norm_kernel, dtype, constants, set(), {"X", "R", "W", "O"}, set())
    return _compiled_row(row, source, arch, {"num_warps": warps, "num_stages": 1})


def compile_swiglu(dtype: torch.dtype, arch: int) -> dict:
    """Compile the SwiGLU kernel (kernels/swiglu_triton.py) as swiglu_triton.swiglu launches it on a GPU
    (its block, libdevice's expf, 4 warps, FMA contraction off); a dict as compile_cell's."""
    from .swiglu_triton import BLOCK, LAUNCH_OPTIONS, _swiglu_kernel

    row: dict[str, Any] = {"cell": f"swiglu {TRITON_TYPES[dtype]} sm_{arch}", "kernel": "swiglu", "arch": arch}
    constants = {"BLOCK": BLOCK, "LIBDEVICE": True}
    source = partial(_ast_source, _swiglu_kernel, dtype, constants, set(), {"G", "U"}, set())
    return _compiled_row(row, source, arch, {**LAUNCH_OPTIONS, "num_stages": 1})


def compile_lse_merge(dtype: torch.dtype, head_dim: int, arch: int) -> dict:
    """Compile the log-sum-exp merge (kernels/merge_triton.py) as merge_triton.lse_merge launches it for
    heads of `head_dim` (its block of rows, 4 warps); a dict as compile_cell's."""
    from .merge_triton import LAUNCH_OPTIONS, _lse_merge_kernel, block_rows

    row: dict[str, Any] = {
        "cell": f"lse_merge {TRITON_TYPES[dtype]} d{head_dim} sm_{arch}",
        "kernel": "lse_merge",
        "arch": arch,
    }
    constants = {"HEAD_DIM": head_dim, "BLOCK_T": block_rows(head_dim), "BLOCK_D": next_power_of_2(head_dim)}
    source = partial(_ast_source, _lse_merge_kernel, dtype, constants, set(), {"OP", "OC", "O"}, {"LP", "LC"})
    return _compiled_row(row, source, arch, {**LAUNCH_OPTIONS, "num_stages": 1})
