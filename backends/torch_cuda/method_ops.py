"""The prefill methods' ops that are plain torch calls, not hand-written kernels: memory-set
choice and gathers (H2O), pooling and reductions (SpecPrefill scoring), and the methods' plain
causal attention [Hq, N, D]. `ops.TorchOps` exposes them with the kernels/ dispatchers under the
ops protocol of core/ops.py (the stage types are core/stages.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specfill.core.config import REDUCTIONS
from specfill.core.errors import ConfigError
from specfill.core.stages import MemorySet


def stage_kernels() -> Any:
    """The kernels/ package, imported by the first H2O or scoring stage: a full prefill never loads
    the kernels, their dispatch or their self-check (start-up: docs/development.md)."""
    import specfill.backends.torch_cuda.kernels as kernels

    return kernels


# one int64 arange per device, grown by doubling: the memory-set choice slices each chunk's positions
# out of it (a view, no launch per chunk); at most 2 x the longest prompt's positions (1 MiB at 64K)
_POSITIONS: dict[torch.device, torch.Tensor] = {}


def positions(start: int, end: int, device: torch.device) -> torch.Tensor:
    """torch.arange(start, end) in int64 on `device`, as a view of the device's cached arange."""
    cached = _POSITIONS.get(device)
    if cached is None or cached.shape[0] < end:
        cached = torch.arange(max(1024, 1 << max(0, end - 1).bit_length()), dtype=torch.int64, device=device)
        _POSITIONS[device] = cached
    return cached[start:end]


def accumulate_scores(scores: torch.Tensor, memory: MemorySet, kv_colsum: torch.Tensor) -> torch.Tensor:
    """scores [Hkv, n] with scores[g, memory[g, s]] += kv_colsum[g, s], as a new tensor."""
    return scores.scatter_add(1, memory.indices, kv_colsum.to(scores.dtype))


def build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy) -> MemorySet:
    """The stage H2OStageOps.build_memory_set on torch tensors, its indices int64, every KV head at once.

    Heavy hitters rank by score, ties to the lower position: the candidates are laid out in
    ascending position and a stable descending sort keeps that order among equal scores.
    """
    n_kv, device = scores.shape[0], scores.device
    split = max(0, chunk_end - chunk_start - local)  # Local_c starts at chunk_start + split
    chunk = positions(chunk_start, chunk_end, device).expand(n_kv, -1)
    local_idx, rest = chunk[:, split:], chunk[:, :split]  # views: no launch
    # M_{c-1} lies before C_c, so [previous, rest] is ascending in every row
    candidates = rest if previous is None else torch.cat([previous.indices.to(torch.int64), rest], dim=1)
    n_heavy = min(heavy, candidates.shape[1])
    if n_heavy == 0:
        return MemorySet(local_idx.contiguous(), chunk_index)
    ranked = torch.sort(scores.gather(1, candidates), dim=1, descending=True, stable=True).indices
    heavy_idx = candidates.gather(1, ranked[:, :n_heavy])
    return MemorySet(torch.cat([heavy_idx, local_idx], dim=1).sort(dim=1).values, chunk_index)


def gather_memory(k: torch.Tensor, v: torch.Tensor, memory: MemorySet) -> tuple[torch.Tensor, torch.Tensor]:
    """k [Hkv, n, D] / v [Hkv, n, Dv] -> k_mem [Hkv, M, D] / v_mem [Hkv, M, Dv]: row g gathers
    positions memory[g]."""
    index = memory.indices.unsqueeze(-1)
    return k.gather(1, index.expand(-1, -1, k.shape[-1])), v.gather(1, index.expand(-1, -1, v.shape[-1]))


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, use_kernels: bool | None = None
) -> torch.Tensor:
    """Plain causal attention [Hq, N, D]: torch SDPA (its fused kernels on CUDA), or the intra
    kernel with one chunk when kernels are forced."""
    kernels = stage_kernels()
    kernels.check_attention_shapes(q, k, v)
    if use_kernels and kernels.choose_kernel(True, q, k, v):
        return kernels.intra_attention(q, k, v, max(1, q.shape[1]), scale, use_kernel=True, with_colsum=False).state.o
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=q.shape[0] != k.shape[0])


def _float(x: torch.Tensor) -> torch.Tensor:
    """Scores are probabilities: float32 at least (float64 stays float64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def smooth_scores(probs: torch.Tensor, kernel: int) -> torch.Tensor:
    """Average pooling along the last axis: stride 1, zero padding kernel // 2 each side, every
    window divided by kernel (count_include_pad), so the length stays P. On a CPU as shifted adds over
    tiles of whole rows that stay in cache (kernels/scoring.pool_rows): avg_pool1d there runs at ~1 add per ns and
    was half of SpecPrefill's scoring at 23K keys (13M probabilities a layer, 40 scoring queries)."""
    if kernel < 1 or kernel % 2 == 0:
        raise ConfigError(f"pool kernel must be a positive odd width, got {kernel}")
    probs = _float(probs)
    if kernel == 1 or probs.shape[-1] == 0:
        return probs.clone()
    flat = probs.reshape(-1, probs.shape[-1])
    if probs.device.type == "cpu":
        return stage_kernels().scoring.pool_rows(flat, kernel).reshape(probs.shape)
    pooled = F.avg_pool1d(flat[:, None], kernel, stride=1, padding=kernel // 2, count_include_pad=True)
    return pooled.reshape(probs.shape)


def reduce_axis(x: torch.Tensor, how: str, axis: int) -> torch.Tensor:
    """ "max" or "mean" over one axis, in float32 or wider."""
    if how not in REDUCTIONS:
        raise ConfigError(f"reduction must be one of {REDUCTIONS}, got {how!r}")
    x = _float(x)
    return x.amax(dim=axis) if how == "max" else x.mean(dim=axis)


def spread(x: torch.Tensor, columns: Any, width: int) -> torch.Tensor:
    """x [..., S] placed at `columns` (S distinct indices) of zeros [..., width]."""
    out = x.new_zeros(x.shape[:-1] + (width,))
    out[..., torch.as_tensor(columns, dtype=torch.long, device=x.device)] = x
    return out
