"""Speculative-prefill token scores and selection in torch (seed 002; spec: core/reference/specprefill.py).

From the speculator's captured post-RoPE queries (last prompt token + look-ahead tokens) and
prompt keys of every layer: softmax over the prompt per scoring query (Triton kernel or twin),
average pooling along positions, max over heads, max (or mean) over layers, mean over the
queries, chunk means, top ceil(n_chunks * keep) chunks (ties to the earlier chunk), the last
token forced in. Kept tokens keep their original position ids; decoding resumes at P.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from specfill.core.config import REDUCTIONS, SpecPrefillConfig
from specfill.core.errors import ConfigError

from .kernels.scoring import attention_scores, check_scoring_shapes

__all__ = ["TokenScores", "TokenSelection", "attention_scores", "chunk_means", "reduce_scores",
           "score_tokens", "select_tokens", "smooth_scores", "speculative_selection", "token_importance"]


class TokenScores(NamedTuple):
    """probs / smoothed [n_q, n_l, Hq, P]; importance [P] (see core.stages.TokenScores)."""

    probs: torch.Tensor
    smoothed: torch.Tensor
    importance: torch.Tensor


class TokenSelection(NamedTuple):
    """kept [K] ascending prompt positions; position_ids [K] their original positions;
    decode_start the position id of the first generated token (the prompt length P);
    chunk_scores [n_chunks] mean importance per selection chunk."""

    kept: torch.Tensor
    position_ids: torch.Tensor
    decode_start: int
    chunk_scores: torch.Tensor


def _float(x: torch.Tensor) -> torch.Tensor:
    """Scores are probabilities: float32 at least (float64 stays float64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def smooth_scores(probs: torch.Tensor, kernel: int) -> torch.Tensor:
    """Average pooling along the last axis: stride 1, zero padding kernel // 2 each side, every
    window divided by kernel (count_include_pad), so the length stays P."""
    if kernel < 1 or kernel % 2 == 0:
        raise ConfigError(f"pool kernel must be a positive odd width, got {kernel}")
    probs = _float(probs)
    if kernel == 1 or probs.shape[-1] == 0:
        return probs.clone()
    flat = probs.reshape(-1, 1, probs.shape[-1])
    pooled = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2, count_include_pad=True)
    return pooled.reshape(probs.shape)


def _reduce(x: torch.Tensor, how: str, dim: int) -> torch.Tensor:
    if how not in REDUCTIONS:
        raise ConfigError(f"reduction must be one of {REDUCTIONS}, got {how!r}")
    return x.amax(dim=dim) if how == "max" else x.mean(dim=dim)


def reduce_scores(probs: torch.Tensor, head_reduction: str, layer_reduction: str) -> torch.Tensor:
    """[n_q, n_l, Hq, P] -> [P]: reduce heads, then layers, then mean over the scoring queries."""
    per_layer = _reduce(_float(probs), head_reduction, dim=2)
    return _reduce(per_layer, layer_reduction, dim=1).mean(dim=0)


def chunk_means(importance: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean importance of each contiguous selection chunk (the last may be shorter), in float64:
    the ranking of near-equal chunks should not depend on the compute dtype."""
    n = importance.shape[0]
    n_chunks = -(-n // chunk)
    padded = F.pad(importance.to(torch.float64), (0, n_chunks * chunk - n))
    counts = torch.full((n_chunks,), float(chunk), dtype=torch.float64, device=importance.device)
    counts[-1] = n - (n_chunks - 1) * chunk
    return padded.reshape(n_chunks, chunk).sum(dim=1) / counts


def select_tokens(importance: torch.Tensor, config: SpecPrefillConfig) -> TokenSelection:
    """Top config.n_kept_chunks(n_chunks) chunks by mean importance (ties to the earlier chunk),
    plus the last token; kept tokens use their original positions, decoding resumes at P."""
    if importance.dim() != 1:
        raise ValueError(f"importance must be [P], got shape {tuple(importance.shape)}")
    n_tokens = int(importance.shape[0])
    if n_tokens < 1:
        raise ConfigError("speculative prefill needs a prompt of at least one token")
    chunk = config.select_chunk
    scores = chunk_means(importance, chunk)
    n_keep = config.n_kept_chunks(int(scores.shape[0]))
    best = torch.sort(scores, descending=True, stable=True).indices[:n_keep]  # stable: earlier chunk wins
    keep_chunk = torch.zeros(scores.shape[0], dtype=torch.bool, device=importance.device)
    keep_chunk[best] = True
    keep = keep_chunk.repeat_interleave(chunk)[:n_tokens]
    if config.force_keep_last:
        keep[n_tokens - 1] = True
    kept = keep.nonzero().squeeze(1)
    return TokenSelection(kept=kept, position_ids=kept.clone(), decode_start=n_tokens, chunk_scores=scores)


def score_tokens(queries: torch.Tensor, keys: torch.Tensor, config: SpecPrefillConfig, scale: float,
                 use_kernels: bool | None = None) -> TokenScores:
    """Every intermediate of the scoring (probs and smoothed are [n_q, n_l, Hq, P]: for
    inspection and checks; `token_importance` gives the same importance in bounded memory)."""
    check_scoring_shapes(queries, keys)
    layers = config.layer_indices(queries.shape[0])
    probs = attention_scores(queries[layers], keys[layers], scale, use_kernel=use_kernels)
    smoothed = smooth_scores(probs, config.pool_kernel)
    importance = reduce_scores(smoothed, config.head_reduction, config.layer_reduction)
    return TokenScores(probs, smoothed, importance)


def token_importance(queries: torch.Tensor, keys: torch.Tensor, config: SpecPrefillConfig, scale: float,
                     use_kernels: bool | None = None) -> torch.Tensor:
    """importance [P] layer by layer: pooling and the head reduction act within one layer, so
    only one layer's probabilities [n_q, Hq, P] exist at a time."""
    check_scoring_shapes(queries, keys)
    layers = config.layer_indices(queries.shape[0])
    combined: torch.Tensor | None = None
    for layer in layers:
        probs = attention_scores(queries[layer:layer + 1], keys[layer:layer + 1], scale, use_kernel=use_kernels)
        per_layer = _reduce(smooth_scores(probs, config.pool_kernel), config.head_reduction, dim=2)[:, 0]
        if combined is None:
            combined = per_layer
        elif config.layer_reduction == "max":
            combined = torch.maximum(combined, per_layer)
        else:
            combined = combined + per_layer
    if config.layer_reduction == "mean":
        combined = combined / len(layers)
    return combined.mean(dim=0)


def speculative_selection(queries: torch.Tensor, keys: torch.Tensor, config: SpecPrefillConfig,
                          scale: float, use_kernels: bool | None = None) -> tuple[torch.Tensor, TokenSelection]:
    """(importance [P], selection): what the main model prefills, from captured queries
    [n_l, n_q, Hq, D] and prompt keys [n_l, Hkv, P, D] of the speculator's layers."""
    importance = token_importance(queries, keys, config, scale, use_kernels)
    return importance, select_tokens(importance, config)
