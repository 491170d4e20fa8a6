"""Speculative-prefill scoring: softmax of each captured query over the prompt keys.

queries [n_l, n_q, Hq, D] (last prompt token + look-ahead, per scoring layer) against keys
[n_l, Hkv, P, D] -> probs [n_q, n_l, Hq, P] in fp32 (fp64 for fp64 inputs).
Triton kernel (kernels/scoring_triton.py) and torch twin, chosen by `attention_scores`; on a CPU the
twin and the pooling (`pool_rows`, method_ops.smooth_scores) run tile by tile, each tile in cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import specfill.backends.torch_cuda.kernels.dispatch as dispatch  # a module reference: tests patch its triton_kernel
from specfill.core.stages import AttentionTerms, active_terms, sinks_of, softcap_of

from .dispatch import SELF_CHECK, choose_kernel, kernel_runs
from .state import stats_dtype

# a CPU tile's elements (float32: 1 MiB), so that a tile's passes run from cache, not memory
TILE_ELEMENTS = 1 << 18


def pool_rows(flat: torch.Tensor, kernel: int) -> torch.Tensor:
    """method_ops.smooth_scores of rows [n, P] on a CPU: per tile of whole rows, the kernel's shifted
    slices of the zero-padded tile summed left to right, then divided by kernel (avg_pool1d's numbers
    up to its summation order: a window's sum of <= kernel float32 terms)."""
    n, width = flat.shape
    half = kernel // 2
    out = torch.empty_like(flat)
    rows = max(1, TILE_ELEMENTS // (width + 2 * half))
    for start in range(0, n, rows):
        padded = F.pad(flat[start : start + rows], (half, half))
        acc = out[start : start + rows]
        torch.add(padded[:, :width], padded[:, 1 : width + 1], out=acc)
        for shift in range(2, kernel):
            acc.add_(padded[:, shift : shift + width])
        acc.div_(kernel)
    return out


def check_scoring_shapes(queries: torch.Tensor, keys: torch.Tensor) -> None:
    if queries.dim() != 4 or keys.dim() != 4:
        raise ValueError(
            f"scoring takes queries [n_l, n_q, Hq, D] and keys [n_l, Hkv, P, D], got "
            f"{tuple(queries.shape)} and {tuple(keys.shape)}"
        )
    if queries.shape[0] != keys.shape[0] or queries.shape[3] != keys.shape[3]:
        raise ValueError(f"queries {tuple(queries.shape)} and keys {tuple(keys.shape)} disagree on layers or head dim")
    if keys.shape[1] == 0 or queries.shape[2] % keys.shape[1] != 0:
        raise ValueError(f"{queries.shape[2]} query heads are not a multiple of {keys.shape[1]} KV heads")


def _terms_probs(
    logits: torch.Tensor, hidden: torch.Tensor | None, terms: AttentionTerms, n_kv: int, group: int, n_queries: int
) -> torch.Tensor:
    """Softmax of scaled logits [n_l, Hkv, G * n_q, P] with the layer's terms: soft-capped before
    the mask (hidden [n_q, P] or None), each row's sink as one more column, dropped after (gpt_oss's
    formulation; a row that sees no key then scores zeros, its mass all on the sink)."""
    softcap, sinks = softcap_of(terms), sinks_of(terms)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if hidden is not None:
        shape = logits.shape
        logits = logits.view(shape[0], n_kv, group, n_queries, shape[-1]).masked_fill(hidden, -math.inf).view(shape)
    if sinks is None:
        probs = torch.softmax(logits, dim=-1)
        return probs if hidden is None else probs.masked_fill(hidden.all(dim=-1).repeat(group)[:, None], 0.0)
    column = sinks.to(device=logits.device, dtype=logits.dtype).reshape(n_kv, group, 1).expand(n_kv, group, n_queries)
    column = column.reshape(1, n_kv, group * n_queries, 1).expand(*logits.shape[:-1], 1)
    return torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)[..., :-1]


def attention_scores_twin(
    queries, keys, scale, window=None, terms=None, query_start=None, tiles: bool | None = None
) -> torch.Tensor:
    """Torch-ops twin (the stage's arguments, P >= 1): the G query heads of a KV head share one
    matmul against its keys; the mask only with a window or an observation window's queries. tiles:
    tile by tile (`_scores_by_tiles`: the same ops on few rows at a time), else over the whole tensor
    at once; None: tiles on a CPU. Attention terms always run over the whole tensor."""
    n_layers, n_queries, n_heads, head_dim = queries.shape
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    stats = stats_dtype(queries, keys)
    hidden = None  # [n_q, P]: the keys a query does not see (its future, or past its window)
    if window is not None or (query_start is not None and query_start < n_keys - 1):
        start = n_keys - 1 if query_start is None else query_start
        distance = (
            start + torch.arange(n_queries, device=keys.device)[:, None] - torch.arange(n_keys, device=keys.device)
        )
        hidden = distance < 0 if window is None else (distance < 0) | (distance >= window)
    if (queries.device.type == "cpu" if tiles is None else tiles) and active_terms(terms) is None:
        return _scores_by_tiles(queries.to(stats), keys.to(stats), scale, hidden)
    # [n_l, Hkv, G*n_q, D]: row g*n_q + q of KV head kv is query q of head kv*G + g
    rows = queries.to(stats).permute(0, 2, 1, 3).reshape(n_layers, n_kv, group * n_queries, head_dim)
    logits = (rows @ keys.to(stats).transpose(-1, -2)) * scale
    if active_terms(terms) is not None:
        probs = _terms_probs(logits, hidden, terms, n_kv, group, n_queries)
        return probs.reshape(n_layers, n_heads, n_queries, n_keys).permute(2, 0, 1, 3).contiguous()
    if hidden is not None:
        logits = logits.view(n_layers, n_kv, group, n_queries, n_keys).masked_fill(hidden, -math.inf)
        probs = torch.softmax(logits, dim=-1).masked_fill(hidden.all(dim=-1)[:, None], 0.0)
        return probs.reshape(n_layers, n_heads, n_queries, n_keys).permute(2, 0, 1, 3).contiguous()
    probs = torch.softmax(logits, dim=-1)
    return probs.reshape(n_layers, n_heads, n_queries, n_keys).permute(2, 0, 1, 3).contiguous()


def _scores_by_tiles(
    queries: torch.Tensor, keys: torch.Tensor, scale: float, hidden: torch.Tensor | None
) -> torch.Tensor:
    """The twin's probabilities [n_q, n_l, Hq, P] on a CPU, a few queries of one head at a time, each
    tile's logits, mask and softmax made in cache and written once into place: over the whole
    [n_l, Hkv, G * n_q, P] at once the same ops were bound by memory (13M float32 logits a layer at 23K
    keys and 40 queries, written and read back six times). The same numbers as the whole-tensor ops:
    each row's logits come from the same products, and the softmax is per row."""
    n_layers, n_queries, n_heads, _ = queries.shape
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    out = torch.empty((n_queries, n_layers, n_heads, n_keys), dtype=queries.dtype, device=queries.device)
    blind, columns = None, slice(0, 0)
    if hidden is not None:  # the mask where it hides something (an observation window: its last columns)
        blind = hidden.all(dim=-1, keepdim=True)  # rows that see no key score zeros
        blind = blind if bool(blind.any()) else None
        seen = hidden.any(dim=0).nonzero()
        columns = slice(int(seen[0]), int(seen[-1]) + 1) if seen.numel() else columns
        hidden = hidden[:, columns]
    rows = max(1, min(n_queries, TILE_ELEMENTS // n_keys))
    for layer in range(n_layers):
        for head in range(n_heads):
            keys_t = keys[layer, head // group].transpose(0, 1)
            for first in range(0, n_queries, rows):
                last = min(n_queries, first + rows)
                logits = torch.mm(queries[layer, first:last, head], keys_t).mul_(scale)
                if hidden is not None:
                    logits[:, columns].masked_fill_(hidden[first:last], -math.inf)
                probs = torch.softmax(logits, dim=-1)
                if blind is not None:
                    probs.masked_fill_(blind[first:last], 0.0)
                out[first:last, layer, head].copy_(probs)
    return out


def attention_scores(
    queries, keys, scale, use_kernel: bool | None = None, window=None, terms=None, query_start=None
) -> torch.Tensor:
    """The stage ScoringStageOps.attention_scores (core/stages.py) on torch tensors: probs fp32
    (fp64 for fp64 inputs), the shapes checked first (check_scoring_shapes: ValueError). use_kernel:
    None = Triton on CUDA, else the twin; True / False force one. The Triton kernel takes the
    observation window's causal mask (query_start) but no sliding window and no attention terms
    (said once): those run the twin.
    """
    check_scoring_shapes(queries, keys)
    kernel = choose_kernel(
        use_kernel, queries, keys, self_check=lambda: _self_check(queries, queries.shape[2] // keys.shape[1])
    )
    n_layers, n_queries, n_heads, _ = queries.shape
    if keys.shape[2] == 0 or n_queries == 0 or n_layers == 0:
        return torch.zeros(
            (n_queries, n_layers, n_heads, keys.shape[2]), dtype=stats_dtype(queries, keys), device=queries.device
        )
    terms = active_terms(terms)
    if kernel_runs("speculative-prefill scoring", kernel, terms, window is not None):
        return dispatch.triton_kernel("scoring_softmax")(queries, keys, scale, query_start=query_start)
    return attention_scores_twin(queries, keys, scale, window, terms, query_start)


def _self_check(like: torch.Tensor, group: int) -> bool:
    """The scoring kernel against its twin on the small fixed case (core/self_check_cases.py)."""

    def run():
        queries, keys = SELF_CHECK.scoring_case(like, group)
        scale, kernel = queries.shape[-1] ** -0.5, dispatch.triton_kernel("scoring_softmax")
        start = keys.shape[2] // 2  # an observation window's queries: the causal mask too
        return SELF_CHECK.tensor_comparisons(
            "probs", kernel(queries, keys, scale), attention_scores_twin(queries, keys, scale)
        ) + SELF_CHECK.tensor_comparisons(
            "probs, observation window",
            kernel(queries, keys, scale, query_start=start),
            attention_scores_twin(queries, keys, scale, query_start=start),
        )

    return SELF_CHECK.kernel_passes("speculative-prefill scoring", like, group, run)
