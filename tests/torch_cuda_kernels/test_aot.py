"""The Triton kernels compile for real GPU targets here, with the tiles the dispatcher picks.

A few cells of scripts/aot_matrix.py's matrix are compiled for sm_89 (the 99 KB-per-block
target, where tiles are tightest; the prefill kernel for sm_90 too, whose tiles are largest
there) in a subprocess (TRITON_INTERPRET must be unset when Triton decorates the kernels); the
committed full matrix must cover today's tile table with no failure.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specfill.backends.torch_cuda.kernels.tiles import (
    ARCH_LIMITS,
    Tiles,
    architecture,
    flash_tiles,
    prefill_tiles,
    resident_blocks,
    scoring_tiles,
)

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "results" / "gpu" / "aot" / "aot_matrix.json"

SUBSET = """
import json, torch
from specfill.backends.torch_cuda.kernels.aot import Cell, compile_cell
cells = [Cell("forward", torch.bfloat16, 128, 1, 89), Cell("colsum", torch.float16, 64, 0, 89),
         Cell("scoring", torch.float32, 128, 32, 89), Cell("forward", torch.float32, 256, 0, 89),
         Cell("prefill", torch.bfloat16, 128, 0, 89), Cell("prefill", torch.bfloat16, 128, 0, 90),
         Cell("prefill-tma", torch.float16, 128, 0, 90), Cell("prefill-tma-wide", torch.bfloat16, 64, 0, 90)]
print(json.dumps([compile_cell(cell) for cell in cells]))
"""


def _cuda_compiler_missing() -> str | None:
    """Why Triton cannot compile for NVIDIA targets on this machine, or None when it can."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (Linux only)"
    from triton import knobs

    try:
        ptxas = knobs.nvidia.ptxas.path
    except (RuntimeError, OSError, AttributeError) as error:  # the NVIDIA backend's tool lookup
        return f"Triton's NVIDIA backend has no ptxas here: {error}"
    return None if Path(ptxas).exists() else f"Triton's bundled ptxas is missing ({ptxas})"


@pytest.mark.gpu_aot
@pytest.mark.skipif(_cuda_compiler_missing() is not None, reason=str(_cuda_compiler_missing()))
def test_kernels_compile_for_sm89_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run([sys.executable, "-c", SUBSET], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    for row in rows:
        assert row["failures"] == [], row
        assert 0 < row["registers"] <= 255 and row["shared_bytes"] <= ARCH_LIMITS[row["arch"]].smem_per_block, row
        assert row["resident_blocks"] >= 1, row


DECODE_SUBSET = """
import json, torch
from specfill.backends.torch_cuda.kernels.aot import compile_decode
cells = [(torch.bfloat16, 128, 4, 90), (torch.float16, 256, 36, 89), (torch.float32, 128, 36, 80)]
print(json.dumps([row for cell in cells for row in compile_decode(*cell)]))
"""


@pytest.mark.gpu_aot
@pytest.mark.skipif(_cuda_compiler_missing() is not None, reason=str(_cuda_compiler_missing()))
def test_decode_kernels_compile_without_spills():
    """The split-key decode kernels (kernels/decode_triton.py) with their GPU tiles: a plain decode
    step's rows on sm_90, two blocks of a long verify step's rows on sm_89 and sm_80 (256-wide heads,
    float32), the merge beside each."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run([sys.executable, "-c", DECODE_SUBSET], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(rows) == 6 and {row["kernel"] for row in rows} == {"decode-split", "decode-merge"}
    for row in rows:
        assert row["failures"] == [] and 0 < row["registers"] <= 255 and row["resident_blocks"] >= 1, row


ROTARY_SUBSET = """
import json, torch
from specfill.backends.torch_cuda.kernels.aot import (
    compile_lse_merge, compile_norm, compile_rotary, compile_rotary_store, compile_swiglu,
)
cells = [(torch.bfloat16, 128, 40, 90), (torch.float16, 80, 6, 89), (torch.float32, 256, 20, 80)]
stores = [(torch.bfloat16, 128, 32, 8, 90), (torch.bfloat16, 64, 32, 8, 90), (torch.float32, 80, 6, 2, 80)]
norms = [(torch.bfloat16, 4096, True, 90), (torch.float16, 1536, False, 89), (torch.float32, 8192, True, 80)]
swiglus = [(torch.bfloat16, 90), (torch.float32, 80)]
rows = [compile_rotary(*cell) for cell in cells] + [compile_norm(*cell) for cell in norms]
merges = [(torch.bfloat16, 128, 90), (torch.bfloat16, 64, 90), (torch.float32, 256, 80)]
rows += [compile_swiglu(*cell) for cell in swiglus]
rows += [compile_lse_merge(*cell) for cell in merges]
print(json.dumps(rows + [compile_rotary_store(*cell) for cell in stores]))
"""


@pytest.mark.gpu_aot
@pytest.mark.skipif(_cuda_compiler_missing() is not None, reason=str(_cuda_compiler_missing()))
def test_fused_element_wise_kernels_compile_without_spills():
    """The rotary kernel (kernels/rope_triton.py) as it launches: an 8B's 40 rotated q + k heads on
    sm_90, a head dim whose half is no power of 2 on sm_89, 256-wide float32 heads on sm_80; the
    RMSNorm kernel (kernels/norm_triton.py): an 8B's rows with the residual add on sm_90, a 1.5B's
    without on sm_89, a 70B's 8,192-wide float32 rows on sm_80; the SwiGLU kernel
    (kernels/swiglu_triton.py) in bfloat16 on sm_90 and float32 on sm_80; the split attention's
    log-sum-exp merge (kernels/merge_triton.py) for the 8B's and the 1B's heads on sm_90, 256-wide
    float32 heads on sm_80; the rotary-and-store kernel (rope_triton.rotary_store) for the 8B's and the
    1B's heads on sm_90, a float32 head dim whose half is no power of 2 on sm_80."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", ROTARY_SUBSET], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    kernels = ["rotary"] * 3 + ["rms_norm"] * 3 + ["swiglu"] * 2 + ["lse_merge"] * 3 + ["rotary_store"] * 3
    assert [row["kernel"] for row in rows] == kernels
    for row in rows:
        assert row["failures"] == [] and 0 < row["registers"] <= 255 and row["resident_blocks"] >= 1, row


def test_committed_matrix_covers_todays_tiles_without_failures():
    """A change to tiles.py must come with a re-run of scripts/aot_matrix.py."""
    from specfill.backends.torch_cuda.kernels.aot import all_cells

    rows = {row["cell"]: row for row in json.loads(MATRIX.read_text())["cells"]}
    cells = all_cells()
    assert len(cells) == len(rows) == 610
    for cell in cells:
        row = rows[cell.label()]
        assert Tiles(row["block_m"], row["block_n"], row["num_warps"], row["num_stages"]) == cell.tiles(), cell
        assert row["failures"] == [], row


def test_capability_maps_to_a_listed_target():
    assert architecture((8, 6)) == 86 and architecture((8, 9)) == 89 and architecture((9, 0)) == 90
    assert architecture((8, 8)) == 87  # between listed targets: the one below
    assert architecture((12, 0)) == 90 and architecture((7, 5)) == 80 and architecture(None) == 80


def test_resident_blocks_by_hand():
    """sm_86: 168 regs x 32 = 5376 -> 5376 per warp (256 steps), 65536 // 5376 = 12 warps = 3
    blocks of 4 warps; 28 KB + 1 KB reserve -> 100 KB // 29 KB = 3; so 3, bound by registers
    (listed first among equals)."""
    assert resident_blocks(ARCH_LIMITS[86], 168, 28 * 1024, 4) == (3, "registers")
    assert resident_blocks(ARCH_LIMITS[90], 32, 0, 4) == (16, "warps")
    assert resident_blocks(ARCH_LIMITS[86], 64, 99 * 1024, 4)[0] == 1


def test_tiles_stay_dot_shaped_and_cover_the_rows():
    for arch in ARCH_LIMITS:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for block_d in (64, 128, 256):
                tiles = flash_tiles(block_d, dtype, arch)
                assert tiles.block_m >= 16 and tiles.block_n >= 16 and tiles.num_stages >= 1
                prefill = prefill_tiles(block_d, dtype, arch)
                assert prefill.block_m >= 16 and prefill.block_n >= 16 and prefill.num_stages >= 1
                if arch >= 90 and dtype != torch.float32 and block_d <= 128:
                    assert prefill_tiles(block_d, dtype, arch, wide=True).block_n == 128
                else:
                    with pytest.raises(ValueError, match="wide prefill tiles"):
                        prefill_tiles(block_d, dtype, arch, wide=True)
                for rows in (1, 8, 16, 40, 64, 512):
                    scoring = scoring_tiles(rows, block_d, dtype, arch)
                    assert 16 <= scoring.block_m <= 64 and scoring.block_n >= 16
