"""NumPy reference of speculative prefill token selection (seed 002, Algorithm 1).

These are the stages; the flow that strings them together (speculator pass, scoring over its
layers, selection, sparse main prefill) is written once in core/methods/specprefill.py.
Scores come from the speculator's queries of the last prompt token and of its greedy
look-ahead tokens against the prompt keys of every scoring layer. Look-ahead queries score
prompt positions only (softmax over the prompt keys), as the reference implementation does.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..config import SpecPrefillConfig
from ..errors import ConfigError
from ..stages import (
    AttentionTerms,
    Selection,
    SpecPrefillStages,
    TokenScores,
    active_terms,
    query_start,
    sinks_of,
    softcap_of,
)
from .attention import accumulation_dtype, expand_kv_heads, masked_state, soft_cap


def scoring_mask(n_queries: int, n_keys: int, window: int | None = None, query_start: int | None = None) -> np.ndarray:
    """[n_q, P] bool: scoring query n sits at position query_start + n (None: P - 1, the last prompt
    token, then the look-ahead tokens) and sees prompt key j iff j <= its position (causal: only an
    observation window's queries, before P - 1, have keys after them) and, with a sliding window,
    its position - j < window."""
    start = n_keys - 1 if query_start is None else query_start
    distance = (start + np.arange(n_queries))[:, None] - np.arange(n_keys)[None, :]
    visible = distance >= 0
    return visible if window is None else visible & (distance < window)


def attention_scores(queries, keys, scale, window=None, terms=None, query_start=None) -> np.ndarray:
    """The stage ScoringStageOps.attention_scores (core/stages.py) on NumPy arrays, in the
    accumulation dtype: a masked softmax (scoring_mask) only with a window or an observation
    window's queries (query_start < P - 1); with sinks the scores sum to less than 1 (the sink's
    share)."""
    dtype = accumulation_dtype(queries, keys)
    keys = expand_kv_heads(keys, queries.shape[2], axis=1).astype(dtype, copy=False)
    # [n_q, n_l, Hq, P] as one BLAS product per (layer, head) of contiguous operands: np.einsum's own loop over
    # "lqhd,lhpd->qlhp" took ~12x as long (0.7 s a layer at 16K keys and 72 queries; the selection protocol
    # scores 24 layers a sample), the same products summed in another order (~1e-14 apart in float64)
    rows = np.ascontiguousarray(queries.astype(dtype, copy=False).transpose(0, 2, 1, 3))  # [n_l, Hq, n_q, D]
    products = np.matmul(rows, np.ascontiguousarray(keys.transpose(0, 1, 3, 2))).transpose(2, 0, 1, 3)
    logits = soft_cap(products * dtype(scale), softcap_of(terms))
    masked = window is not None or (query_start is not None and query_start < keys.shape[2] - 1)
    if sinks_of(terms) is not None:
        visible = (
            scoring_mask(queries.shape[1], keys.shape[2], window, query_start)[:, None, None, :]
            if masked
            else np.bool_(True)
        )
        sinks = np.asarray(sinks_of(terms), dtype=dtype)  # [Hq]: one per row of [n_q, n_l, Hq]
        return masked_state(logits, visible, np.zeros((keys.shape[2], 0), dtype), sinks)[1]
    if not masked:
        logits -= logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits)
        return weights / weights.sum(axis=-1, keepdims=True)
    visible = scoring_mask(queries.shape[1], keys.shape[2], window, query_start)[:, None, None, :]
    return masked_state(logits, visible, np.zeros((keys.shape[2], 0), dtype))[1]


def smooth_scores(probs: np.ndarray, kernel: int) -> np.ndarray:
    """Average pooling along the last axis: stride 1, zero padding kernel // 2 each side,
    every window divided by `kernel` (torch avg_pool1d with count_include_pad)."""
    if kernel == 1:
        return probs.copy()
    pad = kernel // 2
    padded = np.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(pad, pad)])
    csum = np.concatenate([np.zeros_like(padded[..., :1]), np.cumsum(padded, axis=-1)], axis=-1)
    return (csum[..., kernel:] - csum[..., :-kernel]) / kernel


def reduce_axis(x: np.ndarray, how: str, axis: int) -> np.ndarray:
    """ "max" or "mean" over one axis."""
    if how == "max":
        return x.max(axis=axis)
    if how == "mean":
        return x.mean(axis=axis)
    raise ConfigError(f"unknown reduction {how!r}")


def reduce_scores(
    probs: np.ndarray, head_reduction: str, layer_reduction: str, lookahead_reduction: str = "mean"
) -> np.ndarray:
    """[n_q, n_l, Hq, P] -> [P]: reduce heads, then layers, then the scoring queries (the last
    prompt token and the look-ahead tokens: mean, the paper's, or max)."""
    per_layer = reduce_axis(probs, head_reduction, axis=2)
    return reduce_axis(reduce_axis(per_layer, layer_reduction, axis=1), lookahead_reduction, axis=0)


def chunk_means(importance: np.ndarray, chunk: int) -> np.ndarray:
    """[n_chunks] float64: each contiguous selection chunk's mean importance (the last chunk may be
    shorter; it is summed zero-padded to a whole chunk and divided by its real length)."""
    n = len(importance)
    padded = np.pad(np.asarray(importance, np.float64), (0, -n % chunk)).reshape(-1, chunk)
    return padded.sum(axis=1) / np.array([min(chunk, n - start) for start in range(0, n, chunk)], np.float64)


def chunks_reaching_mass(means: np.ndarray, ranked: list[int], chunk: int, n: int, config: SpecPrefillConfig) -> int:
    """The mass rule, one chunk at a time: walk the chunks best first, adding each one's mass (mean
    x length), until the running mass reaches keep_mass of the total (a relative 1e-12 short counts
    as reached); the count, clamped to the config's (floor, ceiling). No mass at all: the floor."""
    low, high = config.chunk_range(len(means))
    masses = [float(means[c]) * min(chunk, n - c * chunk) for c in ranked]
    total = float(np.sum(masses))
    if total <= 0.0:
        return low
    running, count = 0.0, len(masses) + 1
    for i, mass in enumerate(masses):
        running += mass
        if running >= config.keep_mass * total * (1.0 - 1e-12):
            count = i + 1
            break
    return max(low, min(high, count))


def text_units(n: int, config: SpecPrefillConfig) -> list[tuple[int, int]]:
    """The [start, end) of each text unit of an n-token prompt (select_units "text"): from each of
    config.unit_starts below n to the next start, the last to n."""
    if not config.unit_starts:
        raise ConfigError("select_units text needs the prompt's unit_starts", "unit_starts")
    starts = [s for s in config.unit_starts if s < n]
    return list(zip(starts, starts[1:] + [n]))


def _neighbour_reach(config: SpecPrefillConfig) -> int:
    """Tokens kept on each side of a kept chunk: neighbours chunks' length, rounded up to whole tokens
    (the guard: float noise, 0.1 x 30 = 3.0000000000000004, must not add one)."""
    return math.ceil(config.neighbours * config.select_chunk - 1e-9)


def select_tokens(importance: np.ndarray, config: SpecPrefillConfig) -> Selection:
    """The spec of the selection (production's is core/methods/selection.py, held to this one by
    the conformance suite): rank the selection chunks by mean importance (higher first, ties to the
    earlier chunk); keep the top ceil(n_chunks * keep) of them, or as many as the mass rule asks (at
    least config.token_floor tokens' worth), each with the tokens within config.neighbours chunks'
    length (rounded up to whole tokens) either side; text
    units (select_units "text") instead of chunks: the best units until they hold
    config.token_budget(P) tokens, the unit that reaches it included, with their neighbour units; add the
    first keep_first and last keep_last tokens, the protected spans and the last token; kept tokens
    keep their original positions and decoding resumes at P."""
    n = int(importance.shape[0])
    if n < 1:
        raise ConfigError("speculative prefill needs a prompt of at least one token")
    size = config.select_chunk
    if config.select_units == "text":
        units = text_units(n, config)
        means = np.array([np.asarray(importance[a:b], np.float64).sum() / (b - a) for a, b in units])
    else:
        units = [(start, min(n, start + size)) for start in range(0, n, size)]
        means = chunk_means(importance, size)
    ranked = sorted(range(len(means)), key=lambda c: (-means[c], c))
    if config.select_units == "text":  # the best units until they hold the token budget
        n_keep, held = 0, 0
        while held < config.token_budget(n):
            held += units[ranked[n_keep]][1] - units[ranked[n_keep]][0]
            n_keep += 1
    elif config.keep_mass is None:
        n_keep = config.n_kept_chunks(len(means))
    else:
        n_keep = chunks_reaching_mass(means, ranked, size, n, config)
    if config.select_units == "text":  # whole neighbour units
        reach = range(-config.neighbours, config.neighbours + 1)
        chosen = {c + d for c in ranked[:n_keep] for d in reach if 0 <= c + d < len(means)}
        kept = {t for c in chosen for t in range(*units[c])}
    else:  # the tokens within neighbours x size of a kept chunk (a fraction rounds up to whole tokens)
        near = _neighbour_reach(config)
        kept = {t for c in ranked[:n_keep] for t in range(max(0, c * size - near), min(n, (c + 1) * size + near))}
    kept.update(range(min(config.keep_first, n)), range(max(0, n - config.keep_last), n))
    for start, end in config.protected:
        kept.update(range(min(start, n), min(end, n)))
    if config.force_keep_last:
        kept.add(n - 1)
    return restore_positions(np.array(sorted(kept), dtype=np.int64), n, means)


def select_new_tokens(
    importance: np.ndarray,
    reused: int,
    config: SpecPrefillConfig,
    select: Callable[[np.ndarray, SpecPrefillConfig], Selection] | None = None,
) -> Selection:
    """SpecPrefill from a reused prefix of `reused` tokens (docs/methods.md): the selection of the
    new part [reused, P) as a prompt of its own (config.for_new_part: its chunk grid starts at
    `reused`, keep_first and the protected spans still count from the prompt's start), moved back
    to original positions; decoding resumes at P. reused 0 is the whole prompt's selection.
    select: the selection stage (a backend's at the conformance boundary; default the spec's)."""
    select = select or select_tokens
    n = int(importance.shape[0])
    if not 0 <= reused < n:
        raise ConfigError(f"a reused prefix of {reused} tokens must leave new tokens of the {n}-token prompt")
    if reused == 0:
        return select(importance, config)
    new = select(importance[reused:], config.for_new_part(reused))
    return restore_positions(np.asarray(new.kept, dtype=np.int64) + reused, n, new.chunk_scores)


def restore_positions(kept: np.ndarray, prompt_len: int, chunk_scores: np.ndarray) -> Selection:
    """Kept tokens use their original position ids; the first decoded token sits at P."""
    return Selection(kept=kept, position_ids=kept.copy(), decode_start=int(prompt_len), chunk_scores=chunk_scores)


def score_tokens(
    queries: np.ndarray,
    keys: np.ndarray,
    config: SpecPrefillConfig,
    scale: float,
    stages: SpecPrefillStages,
    windows: Sequence[int | None] = (),
    terms: Sequence[AttentionTerms | None] = (),
    n_window: int = 1,
) -> TokenScores:
    """Importance of every prompt token from the scoring layers chosen by `config.layers`, through
    `stages` at the NumPy boundary (the reference itself or a backend's conformance adapter);
    windows / terms: each speculator layer's sliding window / attention terms (empty: none);
    n_window: how many of the queries are the prompt's last tokens' (the observation window, then
    the look-ahead)."""
    layers = config.layer_indices(queries.shape[0])
    start = query_start(keys.shape[2], n_window)
    if windows or any(active_terms(t) is not None for t in terms):  # each layer with its own window and terms
        probs = np.concatenate(
            [
                stages.attention_scores(
                    queries[i : i + 1],
                    keys[i : i + 1],
                    scale,
                    windows[i] if windows else None,
                    active_terms(terms[i]) if terms else None,
                    query_start=start,
                )
                for i in layers
            ],
            axis=1,
        )
    else:
        probs = stages.attention_scores(queries[layers], keys[layers], scale, None, query_start=start)
    smoothed = stages.smooth_scores(probs, config.pool_kernel)
    importance = stages.reduce_scores(
        smoothed, config.head_reduction, config.layer_reduction, config.lookahead_reduction
    )
    return TokenScores(probs=probs, smoothed=smoothed, importance=importance)


def speculative_selection(
    queries, keys, config, scale, stages, windows=(), terms=(), n_window=1, reused: int = 0
) -> tuple[TokenScores, Selection]:
    """Scores then selection: what the main model will prefill (score_tokens' arguments). reused
    R > 0: SpecPrefill from a reused prefix, the scores over every prompt key, the selection over
    the new part [R, P) only (select_new_tokens)."""
    scores = score_tokens(queries, keys, config, scale, stages, windows, terms, n_window)
    return scores, select_new_tokens(scores.importance, reused, config, stages.select_tokens)


def spread(x: np.ndarray, columns: np.ndarray, width: int) -> np.ndarray:
    """x [..., S] placed at `columns` (S distinct indices) of zeros [..., width]."""
    out = np.zeros(x.shape[:-1] + (width,), x.dtype)
    out[..., columns] = x
    return out


def nested_scores(
    queries: np.ndarray,
    keys: np.ndarray,
    deep_queries: np.ndarray,
    deep_keys: np.ndarray,
    slots: np.ndarray,
    config: SpecPrefillConfig,
    scale: float,
    stages: SpecPrefillStages,
    n_window: int = 1,
) -> np.ndarray:
    """A nested pass's importance [P] (SpecPrefillConfig.deep_from): the scored layers among the
    first `split` (queries [split, n_q, Hq, D] over every prompt key, keys [split, Hkv, P, D]) and
    among the deeper ones (deep_queries [n - split, n_q, Hq, D] over the keys of the slots they read,
    deep_keys [n - split, Hkv, S, D], slot s holding prompt position slots[s]); each deeper layer's
    pooled scores sit at its slots' positions, 0 elsewhere; then score_tokens' reductions."""
    split, n_prompt = queries.shape[0], keys.shape[2]
    scored = config.layer_indices(split + deep_queries.shape[0])
    outer = [layer for layer in scored if layer < split]
    inner = [layer - split for layer in scored if layer >= split]
    near = stages.attention_scores(queries[outer], keys[outer], scale, query_start=query_start(n_prompt, n_window))
    parts = [stages.smooth_scores(near, config.pool_kernel)]
    if inner:
        start = query_start(deep_keys.shape[2], n_window)
        far = stages.smooth_scores(
            stages.attention_scores(deep_queries[inner], deep_keys[inner], scale, query_start=start), config.pool_kernel
        )
        parts.append(spread(far, slots, n_prompt))
    return stages.reduce_scores(
        np.concatenate(parts, axis=1), config.head_reduction, config.layer_reduction, config.lookahead_reduction
    )


def keep_count_upper_bound(prompt_len: int, config: SpecPrefillConfig) -> int:
    """Most tokens a selection can keep: its chunks (each with its neighbours; text units: the
    budget, the unit reaching it and each chosen unit's neighbours) plus the boundary spans and the
    forced last token."""
    spans = sum(max(0, min(b, prompt_len) - a) for a, b in config.protected)
    if config.select_units == "text":  # the budget, the unit that reaches it, their neighbour units
        units = text_units(prompt_len, config)
        longest = max(b - a for a, b in units)
        chosen = config.token_budget(prompt_len) + longest - 1
        held = chosen + min(len(units), chosen) * 2 * config.neighbours * longest
        return min(prompt_len, held + config.keep_first + config.keep_last + spans + 1)
    n_chunks = math.ceil(prompt_len / config.select_chunk)
    chunks = config.n_kept_chunks(n_chunks) * (config.select_chunk + 2 * _neighbour_reach(config))
    return min(prompt_len, chunks + config.keep_first + config.keep_last + spans + 1)
