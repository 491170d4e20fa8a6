"""SpecPrefill's scoring (seed 002, step 2), written once over `ModelOps`: the speculator's queries
score every prompt key, layer by layer (core/methods/specprefill.py runs it on a speculator's pass;
core/methods/speculator_depth.py on a nested pass's first layers, to rank what its deeper layers read)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Sequence

import numpy as np

from ..config import SpecPrefillConfig
from ..ops import ModelOps
from ..stages import A, AttentionTerms, active_terms, query_start, window_binds


@dataclass
class DeepScores(Generic[A]):
    """What the deeper layers' scored queries read (SpecPrefillConfig.deep_from): queries
    [n_d, W + N', Hq, D] of the scored layers `layers` (the prompt's last W tokens, then the fed
    look-ahead tokens), each layer's keys over its `slots` prompt slots (`keys(layer)`, [1, Hkv,
    slots, D]: a reused prefix, then the subset) and the prompt position each slot holds
    (`positions`, [slots], increasing)."""

    queries: A
    layers: list[int]
    keys: Callable[[int], A]
    positions: np.ndarray


def token_importance(
    ops: ModelOps[A],
    queries: A,
    keys: A | Callable[[int], A],
    config: SpecPrefillConfig,
    scale: float,
    windows: Sequence[int | None] = (),
    terms: Sequence[AttentionTerms[A] | None] = (),
    n_window: int = 1,
    layers: Sequence[int] | None = None,
    deep: DeepScores[A] | None = None,
) -> A:
    """importance [P] from queries [n_l, n_q, Hq, D] (the first n_window the prompt's last tokens',
    then the look-ahead's) and keys [n_l, Hkv, P, D] or, without a stack of every layer's, a
    function of a layer giving its keys [1, Hkv, P, D] (KVCache.layer_keys); layers: the speculator
    layers the rows of `queries` hold, all scored (run_speculator's capture of config's layers);
    None: row i is layer i, scored where config.layer_indices says. windows: each speculator
    layer's sliding window, empty: all global (a sliding layer scores only the keys its queries
    attended); terms: each layer's attention terms, empty: none.

    Layer by layer (ops.layer_scores: one layer's scores, pooling and head reduction) and the
    layer reduction as a running max or sum, so one layer's probabilities [n_q, Hq, P] (none where
    the ops fuse them) and the running scores [n_q, 1, P] are all that exist at a time (memory
    O(n_q Hq P), whatever the layer count; a lazy backend evaluates each layer before building the
    next). The same composition at the NumPy boundary is core/reference/specprefill.py's score_tokens.

    deep: a nested pass's deeper scored layers (SpecPrefillConfig.deep_from), each over the slots
    it read: their scores, pooled and head-reduced over those slots, join the layer reduction at
    the slots' prompt positions and are 0 at every other position (the reference:
    core/reference/specprefill.nested_scores)."""
    key_of = keys if callable(keys) else (lambda layer: keys[layer : layer + 1])
    scored = list(layers) if layers is not None else config.layer_indices(queries.shape[0])
    rows = range(len(scored)) if layers is not None else scored
    n_keys = key_of(scored[0]).shape[2]
    start = query_start(n_keys, n_window)
    farthest = n_keys + queries.shape[1] - 1 - n_window  # the last look-ahead query to the first key
    # (layer, its queries, its keys, the first query's position, its slots' positions: None, every key)
    passes = [(layer, queries[row : row + 1], key_of, start, None) for layer, row in zip(scored, rows)]
    if deep is not None:  # each over its own slots, placed at their positions
        first = query_start(len(deep.positions), n_window)
        passes += [
            (layer, deep.queries[r : r + 1], deep.keys, first, deep.positions) for r, layer in enumerate(deep.layers)
        ]
    combined = None
    for layer, layer_queries, keys_of, first, positions in passes:
        window = windows[layer] if windows else None
        scores = ops.layer_scores(
            layer_queries,
            keys_of(layer),
            scale,
            window if window_binds(window, farthest) else None,
            active_terms(terms[layer]) if terms else None,
            query_start=first,
            kernel=config.pool_kernel,
            how=config.head_reduction,
        )
        if positions is not None:
            scores = ops.spread(scores, positions, n_keys)
        if combined is None:
            combined = scores
        elif config.layer_reduction == "max":
            combined = ops.reduce_axis(ops.concat([combined, scores], axis=1), "max", axis=1)[:, None]
        else:
            combined = combined + scores  # the mean's sum, divided once at the end
        ops.settle([combined])  # MLX: this layer evaluated (its scores freed) before the next is built
    combined = combined[:, 0] if config.layer_reduction == "max" else combined[:, 0] / len(passes)
    return ops.reduce_axis(combined, config.lookahead_reduction, axis=0)
