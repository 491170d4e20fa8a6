"""The prefill methods' ops that are plain MLX calls, not hand-written kernels: memory-set choice
and gathers (H2O), pooling and reductions (SpecPrefill scoring). `ops.MLXOps` exposes them with
the kernels/ dispatchers under the ops protocol of core/ops.py (the stage types are core/stages.py)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from specfill.core.config import REDUCTIONS
from specfill.core.errors import ConfigError
from specfill.core.stages import MemorySet


def stage_kernels() -> Any:
    """The kernels/ package, imported by the first H2O or scoring stage: a full prefill never loads
    the kernels, their dispatch or their self-check (start-up: docs/development.md)."""
    import specfill.backends.mlx.kernels as kernels

    return kernels


def accumulate_scores(scores: mx.array, memory: MemorySet, kv_colsum: mx.array) -> mx.array:
    """scores[g, memory[g, s]] += kv_colsum[g, s]: the inter attention votes for its keys."""
    rows = mx.arange(scores.shape[0])[:, None]
    return scores.at[rows, memory.indices].add(kv_colsum.astype(scores.dtype))


def build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy) -> MemorySet:
    """The stage H2OStageOps.build_memory_set on MLX arrays, its indices int32.

    Candidates are laid out in ascending position (M_{c-1} lies before C_c), so ranking by score
    with ties to the lower index gives ties to the lower position, as the spec requires.
    """
    n_kv = scores.shape[0]
    local_start = max(chunk_start, chunk_end - local)
    local_idx = mx.broadcast_to(mx.arange(local_start, chunk_end, dtype=mx.int32), (n_kv, chunk_end - local_start))
    chunk_rest = mx.broadcast_to(mx.arange(chunk_start, local_start, dtype=mx.int32), (n_kv, local_start - chunk_start))
    parts = [previous.indices.astype(mx.int32), chunk_rest] if previous is not None else [chunk_rest]
    candidates = mx.concatenate(parts, axis=1)
    n_heavy = min(heavy, candidates.shape[1])
    rows = [local_idx]
    if n_heavy > 0:
        from .ranking import descending_order  # H2O only

        order = descending_order(mx.take_along_axis(scores, candidates, axis=1))[:, :n_heavy]
        rows.append(mx.take_along_axis(candidates, order, axis=1))
    return MemorySet(mx.sort(mx.concatenate(rows, axis=1), axis=1), chunk_index)


def gather_memory(k: mx.array, v: mx.array, memory: MemorySet) -> tuple[mx.array, mx.array]:
    """Per-KV-head gather of the memory rows: k/v [Hkv, n, D or Dv] -> [Hkv, M, D or Dv]."""
    idx = memory.indices[:, :, None]
    return mx.take_along_axis(k, idx, axis=1), mx.take_along_axis(v, idx, axis=1)


def smooth_scores(probs: mx.array, kernel: int) -> mx.array:
    """Average pooling along the last axis: stride 1, zero padding kernel // 2 each side, every
    window divided by `kernel` (torch avg_pool1d with count_include_pad)."""
    if kernel < 1 or kernel % 2 == 0:
        raise ConfigError(f"pool kernel must be a positive odd width, got {kernel}")
    if kernel == 1:
        return probs.astype(mx.float32)
    pad = kernel // 2
    n = probs.shape[-1]
    padded = mx.pad(probs.astype(mx.float32), [(0, 0)] * (probs.ndim - 1) + [(pad, pad)])
    # k shifted slices: exact window sums, no long cumulative sum to lose precision in
    total = padded[..., 0:n]
    for shift in range(1, kernel):
        total = total + padded[..., shift : shift + n]
    return total / kernel


def reduce_axis(x: mx.array, how: str, axis: int) -> mx.array:
    """ "max" or "mean" over one axis, in float32."""
    if how not in REDUCTIONS:
        raise ConfigError(f"reduction must be one of {REDUCTIONS}, got {how!r}")
    x = x.astype(mx.float32)
    return x.max(axis=axis) if how == "max" else x.mean(axis=axis)


def spread(x: mx.array, columns: Any, width: int) -> mx.array:
    """x [..., S] placed at `columns` (S distinct indices) of zeros [..., width]."""
    out = mx.zeros(x.shape[:-1] + (width,), dtype=x.dtype)
    out[..., mx.array(columns, dtype=mx.int32)] = x
    return out
