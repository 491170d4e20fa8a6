"""Speculative prefill token selection (seed 002, Algorithm 1) on MLX.

The speculator's queries of the last prompt token and of its greedy look-ahead tokens score
every prompt position per scoring layer; scores are smoothed along positions, reduced over
heads and layers, averaged over the scoring queries, then whole selection chunks are kept.
Follows core/reference/specprefill.py step for step.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from specfill.core.config import REDUCTIONS, SpecPrefillConfig
from specfill.core.errors import ConfigError

from .kernels import attention_scores
from .ranking import descending_order


@dataclass(frozen=True)
class TokenScores:
    """probs and smoothed [n_q, n_l, Hq, P] float32; importance [P] float32."""

    probs: mx.array
    smoothed: mx.array
    importance: mx.array


@dataclass(frozen=True)
class Selection:
    """kept [K] ascending int32 prompt positions; position_ids [K] their ORIGINAL positions (the
    RoPE positions of the sparse main prefill); decode_start = prompt length P; chunk_scores
    [n_chunks] mean importance per selection chunk."""

    kept: mx.array
    position_ids: mx.array
    decode_start: int
    chunk_scores: mx.array


def smooth_scores(probs: mx.array, kernel: int) -> mx.array:
    """Average pooling along the last axis: stride 1, zero padding kernel // 2 each side, every
    window divided by `kernel` (torch avg_pool1d with count_include_pad)."""
    if kernel == 1:
        return probs
    if kernel < 1 or kernel % 2 == 0:
        raise ConfigError(f"pool kernel must be odd and positive, got {kernel}")
    pad = kernel // 2
    n = probs.shape[-1]
    padded = mx.pad(probs.astype(mx.float32), [(0, 0)] * (probs.ndim - 1) + [(pad, pad)])
    # k shifted slices: exact window sums, no long cumulative sum to lose precision in
    total = padded[..., 0:n]
    for shift in range(1, kernel):
        total = total + padded[..., shift:shift + n]
    return total / kernel


def _reduce(x: mx.array, how: str, axis: int) -> mx.array:
    if how == "max":
        return x.max(axis=axis)
    if how == "mean":
        return x.mean(axis=axis)
    raise ConfigError(f"reduction must be one of {REDUCTIONS}, got {how!r}")


def reduce_scores(probs: mx.array, head_reduction: str, layer_reduction: str) -> mx.array:
    """[n_q, n_l, Hq, P] -> [P]: reduce heads, then layers, then mean over the scoring queries."""
    per_layer = _reduce(probs.astype(mx.float32), head_reduction, axis=2)
    return _reduce(per_layer, layer_reduction, axis=1).mean(axis=0)


def chunk_means(importance: mx.array, chunk: int) -> mx.array:
    """Mean importance of each contiguous selection chunk (the last may be shorter)."""
    n = importance.shape[0]
    n_chunks = math.ceil(n / chunk)
    padded = mx.pad(importance.astype(mx.float32), [(0, n_chunks * chunk - n)])
    sums = padded.reshape(n_chunks, chunk).sum(axis=1)
    counts = mx.minimum(mx.full((n_chunks,), chunk), n - mx.arange(n_chunks) * chunk)
    return sums / counts.astype(mx.float32)


def select_tokens(importance: mx.array, config: SpecPrefillConfig) -> Selection:
    """Top n_kept_chunks chunks by mean score (ties to the earlier chunk), plus the last token;
    kept tokens keep their original positions and decoding resumes at P."""
    n_tokens = int(importance.shape[0])
    if n_tokens < 1:
        raise ConfigError("speculative prefill needs a prompt of at least one token")
    chunk = config.select_chunk
    scores = chunk_means(importance, chunk)
    n_chunks = scores.shape[0]
    top = descending_order(scores)[:config.n_kept_chunks(n_chunks)]
    keep_chunk = mx.zeros((n_chunks,), dtype=mx.int32).at[top].add(1) > 0
    positions = mx.arange(n_tokens, dtype=mx.int32)
    keep = keep_chunk[positions // chunk]
    if config.force_keep_last:
        keep = keep | (positions == n_tokens - 1)
    n_kept = int(keep.sum().item())  # the kept count sets the main prefill's shape: one sync
    kept = mx.sort(mx.where(keep, positions, positions + n_tokens))[:n_kept]
    return restore_positions(kept, n_tokens, scores)


def restore_positions(kept: mx.array, prompt_len: int, chunk_scores: mx.array) -> Selection:
    """Kept tokens use their original position ids; the first decoded token sits at P."""
    return Selection(kept=kept, position_ids=kept, decode_start=int(prompt_len), chunk_scores=chunk_scores)


def _scoring_layers(x: mx.array | Sequence[mx.array], layers: list[int]) -> mx.array:
    """The scoring layers, stacked: a per-layer list stacks only those, an array is sliced."""
    if isinstance(x, mx.array):
        return x[layers[0]:layers[-1] + 1]  # "all" and "last-K" are contiguous ranges
    return mx.stack([x[i] for i in layers])


def score_tokens(queries: mx.array | Sequence[mx.array], keys: mx.array | Sequence[mx.array],
                 config: SpecPrefillConfig, scale: float, use_kernels: bool | None = None) -> TokenScores:
    """Importance of every prompt token from the speculator's captured tensors.

    queries [n_layers, n_q, Hq, D] (or a list of [n_q, Hq, D]) and keys [n_layers, Hkv, P, D]
    (or a list of [Hkv, P, D]) for every speculator layer; config.layers picks the scoring ones.
    """
    n_layers = queries.shape[0] if isinstance(queries, mx.array) else len(queries)
    n_key_layers = keys.shape[0] if isinstance(keys, mx.array) else len(keys)
    if n_layers != n_key_layers:
        raise ValueError(f"queries cover {n_layers} layers but keys cover {n_key_layers}")
    layers = config.layer_indices(n_layers)
    probs = attention_scores(_scoring_layers(queries, layers), _scoring_layers(keys, layers), scale,
                             use_kernel=use_kernels)
    smoothed = smooth_scores(probs, config.pool_kernel)
    importance = reduce_scores(smoothed, config.head_reduction, config.layer_reduction)
    return TokenScores(probs=probs, smoothed=smoothed, importance=importance)


def token_importance(queries: mx.array, keys: mx.array, config: SpecPrefillConfig, scale: float,
                     use_kernels: bool | None = None) -> mx.array:
    """importance [P] (as score_tokens) layer by layer: pooling and the head reduction act within
    one layer, so only one layer's probabilities [n_q, Hq, P] exist at a time (each layer is
    evaluated before the next is scored). queries [n_l, n_q, Hq, D], keys [n_l, Hkv, P, D]."""
    if queries.shape[0] != keys.shape[0]:
        raise ValueError(f"queries cover {queries.shape[0]} layers but keys cover {keys.shape[0]}")
    layers = config.layer_indices(queries.shape[0])
    combined: mx.array | None = None
    for layer in layers:
        probs = attention_scores(queries[layer:layer + 1], keys[layer:layer + 1], scale,
                                 use_kernel=use_kernels)
        per_layer = _reduce(smooth_scores(probs, config.pool_kernel), config.head_reduction, axis=2)[:, 0]
        if combined is None:
            combined = per_layer
        elif config.layer_reduction == "max":
            combined = mx.maximum(combined, per_layer)
        else:
            combined = combined + per_layer
        mx.eval(combined)
    if config.layer_reduction == "mean":
        combined = combined / len(layers)
    return combined.mean(axis=0)


def speculative_selection(queries: mx.array | Sequence[mx.array], keys: mx.array | Sequence[mx.array],
                          config: SpecPrefillConfig, scale: float,
                          use_kernels: bool | None = None) -> tuple[TokenScores, Selection]:
    """Scores then selection: which prompt tokens the main model prefills, at which positions."""
    scores = score_tokens(queries, keys, config, scale, use_kernels)
    return scores, select_tokens(scores.importance, config)
