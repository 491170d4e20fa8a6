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


def _hidden(
    n_queries: int, n_keys: int, window: int | None, query_start: int | None, device: torch.device
) -> torch.Tensor | None:
    """[n_q, P]: the keys a query does not see (its future, or past its window); None: it sees every key."""
    if window is None and (query_start is None or query_start >= n_keys - 1):
        return None
    start = n_keys - 1 if query_start is None else query_start
    distance = start + torch.arange(n_queries, device=device)[:, None] - torch.arange(n_keys, device=device)
    return distance < 0 if window is None else (distance < 0) | (distance >= window)


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
    hidden = _hidden(n_queries, n_keys, window, query_start, keys.device)
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
    out = torch.empty((n_queries, n_layers, n_heads, keys.shape[2]), dtype=queries.dtype, device=queries.device)
    tile = _TileProbs(queries, keys, scale, hidden)
    rows = max(1, min(n_queries, TILE_ELEMENTS // keys.shape[2]))
    for layer in range(n_layers):
        for head in range(n_heads):
            for first in range(0, n_queries, rows):
                last = min(n_queries, first + rows)
                out[first:last, layer, head].copy_(tile(layer, head, first, last))
    return out


class _TileProbs:
    """The probabilities of a few queries of one head (a tile), made in cache: their logits, the
    mask where it hides something (an observation window: its last columns), the softmax, and zeros
    for rows that see no key. Rows do not depend on the tile they are made in (each is its own
    products and softmax)."""

    def __init__(self, queries: torch.Tensor, keys: torch.Tensor, scale: float, hidden: torch.Tensor | None):
        self.queries, self.keys, self.scale = queries, keys, scale
        self.group = queries.shape[2] // keys.shape[1]
        self.blind, self.columns, self.hidden = None, slice(0, 0), None
        if hidden is not None:
            blind = hidden.all(dim=-1, keepdim=True)  # rows that see no key score zeros
            self.blind = blind if bool(blind.any()) else None
            seen = hidden.any(dim=0).nonzero()
            self.columns = slice(int(seen[0]), int(seen[-1]) + 1) if seen.numel() else self.columns
            self.hidden = hidden[:, self.columns]

    def __call__(self, layer: int, head: int, first: int, last: int) -> torch.Tensor:
        keys_t = self.keys[layer, head // self.group].transpose(0, 1)
        logits = torch.mm(self.queries[layer, first:last, head], keys_t).mul_(self.scale)
        if self.hidden is not None:
            logits[:, self.columns].masked_fill_(self.hidden[first:last], -math.inf)
        probs = torch.softmax(logits, dim=-1)
        if self.blind is not None:
            probs.masked_fill_(self.blind[first:last], 0.0)
        return probs


def pooled_head_scores(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scale: float,
    window: int | None,
    query_start: int | None,
    kernel: int,
    how: str,
) -> torch.Tensor:
    """ScoringOps.layer_scores on a CPU without attention terms, fused: queries [n_l, n_q, Hq, D],
    keys [n_l, Hkv, P, D] -> [n_q, n_l, P] float32 (float64 for float64 inputs). A few queries at a
    time, head after head, each tile's probabilities, pooling (`pool_rows`' shifted adds, in its
    order) and head reduction made in cache: the three stages one after the other wrote and read
    back [n_q, n_l, Hq, P] twice (66 MB a layer at 16K keys and 72 queries, ~1.7x the time). The
    same numbers as those stages for "max"; for "mean" the heads are summed in order, then divided
    (Tensor.mean's order may differ: float32 rounding, tests/torch_cuda_kernels)."""
    check_scoring_shapes(queries, keys)
    n_layers, n_queries, n_heads, _ = queries.shape
    n_keys, stats = keys.shape[2], stats_dtype(queries, keys)
    out = torch.empty((n_queries, n_layers, n_keys), dtype=stats, device=queries.device)  # every row set below
    if out.numel() == 0:
        return out
    hidden = _hidden(n_queries, n_keys, window, query_start, keys.device)
    tile = _TileProbs(queries.to(stats), keys.to(stats), scale, hidden)
    half = kernel // 2
    rows = max(1, min(n_queries, TILE_ELEMENTS // (n_keys + 2 * half)))
    padded = torch.zeros((rows, n_keys + 2 * half), dtype=stats, device=queries.device)  # edges stay 0
    pooled = torch.empty((rows, n_keys), dtype=stats, device=queries.device)
    for layer in range(n_layers):
        for first in range(0, n_queries, rows):
            last = min(n_queries, first + rows)
            acc, inner, sums = out[first:last, layer], padded[: last - first], pooled[: last - first]
            for head in range(n_heads):
                probs = tile(layer, head, first, last)
                if kernel > 1:
                    inner[:, half : half + n_keys].copy_(probs)
                    torch.add(inner[:, :n_keys], inner[:, 1 : n_keys + 1], out=sums)
                    for shift in range(2, kernel):
                        sums.add_(inner[:, shift : shift + n_keys])
                    probs = sums.div_(kernel)
                if head == 0:
                    acc.copy_(probs)
                elif how == "max":
                    torch.maximum(acc, probs, out=acc)
                else:
                    acc.add_(probs)
            if how != "max":
                acc.div_(n_heads)
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
