"""Tile and launch choices of the Triton kernels per GPU architecture, and each architecture's limits.

Pure Python (no Triton, no CUDA call): the dispatchers look a choice up for the device they launch
on, and scripts/aot_matrix.py compiles every choice ahead of time for every listed target and
checks it against the limits below (registers, spills, shared memory, resident blocks).

Why per architecture: sm_86 (RTX 30xx) and sm_89 (RTX 40xx) give a block at most 99 KB of shared
memory against 163 KB on sm_80 / sm_87 and 227 KB on sm_90, and every target has 64K registers
per SM; a tile that pipelines well on an H100 spills or does not fit on an RTX 4090.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ArchLimits(NamedTuple):
    """Per-SM limits of one compute capability.

    Source: NVIDIA, CUDA C++ Programming Guide, appendix "Compute Capabilities", table
    "Technical Specifications per Compute Capability" (CUDA 12.x), rows: maximum resident
    blocks / warps / threads per SM, 32-bit registers per SM, maximum registers per thread,
    maximum shared memory per SM and per block (opt-in), shared memory reserved by the system
    per block (1 KB on 8.x and 9.0). Register allocation unit (256 per warp) and shared memory
    allocation unit (128 B): the CUDA Occupancy Calculator's per-capability constants.
    """

    name: str
    max_blocks: int
    max_warps: int
    registers: int
    max_regs_per_thread: int
    smem_per_sm: int
    smem_per_block: int
    smem_reserved: int = 1024
    reg_unit: int = 256
    smem_unit: int = 128


KB = 1024
ARCH_LIMITS: dict[int, ArchLimits] = {
    80: ArchLimits("A100 (sm_80)", 32, 64, 65536, 255, 164 * KB, 163 * KB),
    86: ArchLimits("RTX 30xx / A10 (sm_86)", 16, 48, 65536, 255, 100 * KB, 99 * KB),
    87: ArchLimits("Jetson Orin (sm_87)", 16, 48, 65536, 255, 164 * KB, 163 * KB),
    89: ArchLimits("RTX 40xx / L4 (sm_89)", 24, 48, 65536, 255, 100 * KB, 99 * KB),
    90: ArchLimits("H100 (sm_90)", 32, 64, 65536, 255, 228 * KB, 227 * KB),
}
TARGETS = tuple(ARCH_LIMITS)


class Tiles(NamedTuple):
    """One launch choice: rows x keys per tile, warps, software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def architecture(capability: tuple[int, int] | None) -> int:
    """The listed target a (major, minor) capability takes its tiles from: itself when listed,
    else the nearest listed one below it (an unknown newer GPU gets the sm_90 choices; a
    pre-Ampere one gets sm_80's, which its own limits may still reject at launch)."""
    if capability is None:
        return 80
    cc = capability[0] * 10 + capability[1]
    lower = [t for t in TARGETS if t <= cc]
    return max(lower) if lower else min(TARGETS)


def _small_smem(arch: int) -> bool:
    return ARCH_LIMITS[arch].smem_per_block < 128 * KB


def flash_tiles(block_d: int, dtype: torch.dtype, arch: int) -> Tiles:
    """The forward / column-sum kernels' tiles for head dim padded to block_d (16..256).

    fp32 runs its dots as exact FMA loops (input_precision "ieee", no tensor cores), whose
    operand layouts take far more registers than an MMA's: 64-row fp32 tiles spill on every
    target, so fp32 gets 16-32 row tiles (8 warps at 256). 16-bit tiles are MMA-shaped; the
    99 KB targets (sm_86, sm_89) pipeline one stage fewer.
    """
    if dtype == torch.float32:
        if block_d <= 64:
            return Tiles(32, 16, 4, 2)
        return Tiles(16, 16, 4, 1) if block_d <= 128 else Tiles(32, 16, 8, 1)
    stages = 2 if _small_smem(arch) else 3
    if block_d <= 64:
        return Tiles(64, 64, 4, stages)
    if block_d <= 128:
        return Tiles(64, 32, 4, stages)
    return Tiles(64, 32, 8, 2)


def prefill_tiles(block_d: int, dtype: torch.dtype, arch: int, wide: bool = False) -> Tiles:
    """The prefill kernel's tiles (kernels/prefill_triton.py) for head dim padded to block_d.

    float32 (FMA dots, see flash_tiles) takes flash_tiles' tiles, with 8 warps for heads of 65-128
    (4 spilled there). 16-bit inputs take the fused-attention tutorial's shape where it fits: 128
    query rows and 8 warps (two warpgroups' MMAs on sm_90) against 64-key tiles, 3 pipeline stages
    where a block may hold 163 KB or more of shared memory; the 99 KB targets (sm_86, sm_89) pipeline
    2 stages and take 64 x 32 tiles with 4 warps for heads of 65-128 (64 x 64 spilled), and 256-wide
    heads take 64 x 32 everywhere. Each choice compiles without a spill and within shared memory on
    every target (scripts/aot_matrix.py); 4 warps for 128 rows spilled on sm_80.

    wide: the fused-attention tutorial's other Hopper shape, 128 x 128 tiles with 8 warps (its autotuner
    keeps 8 warps on sm_90 only for tiles of 128 x 128 or more), 2 stages for heads of 65-128 (165 KB of
    shared memory; 3 would take 225 of the 227 KB), 3 up to 64 (116 KB): the TMA kernel's second
    candidate in the attention probe, sm_90 and 16-bit heads up to 128 only (ValueError elsewhere)."""
    if wide:
        if arch < 90 or dtype == torch.float32 or block_d > 128:
            raise ValueError(
                f"wide prefill tiles are for sm_90's 16-bit heads up to 128, not {dtype} d{block_d} sm_{arch}"
            )
        return Tiles(128, 128, 8, 3 if block_d <= 64 else 2)
    if dtype == torch.float32:
        return Tiles(16, 16, 8, 1) if 64 < block_d <= 128 else flash_tiles(block_d, dtype, arch)
    small = _small_smem(arch)
    if block_d > 128:
        return Tiles(64, 32, 8, 2 if small else 3)
    if small and block_d > 64:
        return Tiles(64, 32, 4, 2)
    return Tiles(128, 64, 8, 2 if small else 3)


def scoring_tiles(rows: int, block_d: int, dtype: torch.dtype, arch: int) -> Tiles:
    """The scoring kernel's tiles: BLOCK_M is its rows per program (G query heads x n_q scoring
    queries, covered up to a cap), BLOCK_N its keys per tile. The query rows stay in registers
    for both passes; fp32 (FMA dots, see flash_tiles) caps them at 64 / 32 / 16 rows for head
    dims up to 64 / 128 / 256 and walks 16 keys a tile with 8 warps."""
    if dtype == torch.float32:
        cap = 64 if block_d <= 64 else (32 if block_d <= 128 else 16)
        block_r = max(16, min(cap, 1 << max(0, rows - 1).bit_length()))
        return Tiles(block_r, 16, 8, 2 if block_d <= 128 else 1)
    block_r = max(16, min(64, 1 << max(0, rows - 1).bit_length()))
    block_n = 64 if block_r * block_d <= 64 * 64 else 32
    return Tiles(block_r, block_n, 4, 2 if _small_smem(arch) else 3)


def resident_blocks(limits: ArchLimits, regs_per_thread: int, shared_bytes: int, num_warps: int) -> tuple[int, str]:
    """(blocks resident per SM, the limit that binds): the least of the block, warp, register
    and shared-memory bounds, with registers allocated per warp in reg_unit steps and shared
    memory per block rounded to smem_unit plus the system's reserved kilobyte."""
    per_warp = -(-regs_per_thread * 32 // limits.reg_unit) * limits.reg_unit
    warps_by_regs = limits.registers // per_warp if per_warp else limits.max_warps
    smem = -(-(shared_bytes + limits.smem_reserved) // limits.smem_unit) * limits.smem_unit
    bounds = {
        "blocks": limits.max_blocks,
        "warps": limits.max_warps // num_warps,
        "registers": warps_by_regs // num_warps,
        "shared memory": limits.smem_per_sm // smem,
    }
    binding = min(bounds, key=bounds.get)
    return bounds[binding], binding
