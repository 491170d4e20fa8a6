"""Speculative prefill (seed 002), written once over `ModelOps`.

1. The speculator runs the whole prompt (full attention) and keeps, per layer, the post-RoPE
   queries of the last W prompt tokens (config.query_window; 1, the paper's: the last token
   only); it then decodes up to `lookahead` greedy tokens, feeding each one that is not a stop id
   and keeping its query too. Its KV cache holds the prompt keys.
2. The W + N' queries score the prompt positions: softmax over the prompt keys per scoring query
   (an observation window's query over the keys at or before its own position),
   average pooling along positions, a head reduction and a layer reduction, then the queries'
   reduction (config.lookahead_reduction: mean, or max).
3. Whole selection chunks are kept (NumPy, float64 chunk means: core/reference/specprefill.py),
   and the main model prefills only the kept tokens, into cache slots 0..K-1 at their ORIGINAL
   position ids; decoding continues at position P (the prompt length), slot K.
Sliding layers: the speculator attends and scores inside its own windows; the main model's
sliding layers apply theirs over ORIGINAL positions, not over kept-token counts (its cache
records each slot's position). A layer's attention terms (soft-cap, sinks: core/stages.AttentionTerms)
enter the speculator's attention and the scoring softmaxes alike (layer_terms, like the windows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Sequence

import numpy as np

from ..config import SpecPrefillConfig
from ..ops import ModelOps, ScoringOps
from ..stages import (
    A,
    AttentionTerms,
    Selection,
    active_terms,
    attention_layers,
    layer_terms,
    query_start,
    window_binds,
)
from .prefill import StageProgress, prefill


def token_importance(
    ops: ScoringOps[A],
    queries: A,
    keys: A,
    config: SpecPrefillConfig,
    scale: float,
    windows: Sequence[int | None] = (),
    terms: Sequence[AttentionTerms[A] | None] = (),
    n_window: int = 1,
) -> A:
    """importance [P] from queries [n_l, n_q, Hq, D] (the first n_window the prompt's last tokens',
    then the look-ahead's) and keys [n_l, Hkv, P, D], layer by layer (windows: each speculator
    layer's sliding window, empty: all global; a sliding layer scores only the keys its queries
    attended; terms: each layer's attention terms, empty: none): pooling and the head reduction
    act within one layer, so only one layer's probabilities [n_q, Hq, P] exist at a time (then
    [n_q, n_l, P] for the layer and query reductions). The same composition at the NumPy
    boundary is core/reference/specprefill.py's score_tokens."""
    per_layer = []
    start = query_start(keys.shape[2], n_window)
    farthest = keys.shape[2] + queries.shape[1] - 1 - n_window  # the last look-ahead query to the first key
    for layer in config.layer_indices(queries.shape[0]):
        window = windows[layer] if windows else None
        probs = ops.attention_scores(
            queries[layer : layer + 1],
            keys[layer : layer + 1],
            scale,
            window if window_binds(window, farthest) else None,
            active_terms(terms[layer]) if terms else None,
            query_start=start,
        )
        per_layer.append(ops.reduce_axis(ops.smooth_scores(probs, config.pool_kernel), config.head_reduction, axis=2))
    combined = ops.reduce_axis(ops.concat(per_layer, axis=1), config.layer_reduction, axis=1)
    return ops.reduce_axis(combined, config.lookahead_reduction, axis=0)


class QueryCapture(Generic[A]):
    """`PrefillAttention` for the speculator: causal attention (inside each layer's sliding window,
    `windows`, with each layer's attention `terms`) that also keeps, per layer, the post-RoPE
    queries of the prompt's last `n_window` tokens (the prompt ends at slot `first_slot`) and the
    query of every later step (each fed look-ahead token)."""

    def __init__(
        self,
        ops: ModelOps[A],
        n_layers: int,
        first_slot: int,
        scale: float,
        windows: Sequence[int | None] = (),
        terms: Sequence[AttentionTerms[A] | None] = (),
        n_window: int = 1,
    ):
        self.ops = ops
        self.windows = list(windows) or [None] * n_layers
        self.terms = [active_terms(t) for t in terms] or [None] * n_layers
        self.first_slot = first_slot
        self.window_start = first_slot - n_window
        self.scale = scale
        self.queries: list[list[A]] = [[] for _ in range(n_layers)]

    def __call__(self, layer: int, q: A, k: A, v: A) -> A:
        end = k.shape[2]  # k holds every slot up to this step's end
        if end > self.window_start:  # a step ending inside the window, or a look-ahead step
            n = end - max(self.window_start, end - q.shape[2]) if end <= self.first_slot else 1
            self.queries[layer].append(self.ops.last_queries(q, n))
        return self.ops.causal_step(q, k, v, self.scale, self.windows[layer], self.terms[layer])

    def arrays(self) -> list[A]:
        return [q for per_layer in self.queries for q in per_layer]

    def stacked(self, layers: Sequence[int] | None = None) -> A:
        """[n_layers, n_queries, Hq, D] of `layers` (None: every layer)."""
        chosen = range(len(self.queries)) if layers is None else layers
        return self.ops.stack([self.ops.concat(self.queries[i], axis=0) for i in chosen])


@dataclass
class SpeculatorPass(Generic[A]):
    """queries [n_l, W + N', Hq, D] (the prompt's last W tokens, then the fed look-ahead tokens);
    keys [n_l, Hkv, P, D] of every prompt position; lookahead the fed tokens; cache the
    speculator's KV cache (prompt, then look-ahead slots), kept for a later use as a draft model;
    n_window: W (the query window, clamped to the prompt)."""

    queries: A
    keys: A
    lookahead: list[int]
    cache: Any
    model: Any
    n_window: int = 1


def run_speculator(
    ops: ModelOps[A],
    speculator: Any,
    ids: np.ndarray,
    *,
    lookahead: int,
    stop_ids: frozenset[int],
    step_size: int,
    report: StageProgress | None = None,
    extra_slots: int = 0,
    query_window: int = 1,
) -> SpeculatorPass[A]:
    """Full prefill of ids [P] on the speculator, then greedy look-ahead (see the module doc).

    The look-ahead stops early at a stop id (which is not fed); `lookahead` fits the speculator's
    context (core/request.fit_lookahead: a run's config comes clamped by fit_to_prompt).
    extra_slots: cache room after the prompt beyond the look-ahead (the speculator drafting later).
    report: told after each step of the pass ("speculator") and each fed token ("lookahead").
    query_window: the prompt's last tokens whose queries are kept (at most the prompt).
    """
    n_prompt, args = len(ids), speculator.args
    n_window = max(1, min(query_window, n_prompt))
    cache = ops.new_cache(speculator, n_prompt + max(lookahead, extra_slots))
    capture = QueryCapture(
        ops, args.num_hidden_layers, n_prompt, args.attention_scale, args.layer_windows, layer_terms(args), n_window
    )
    logits = prefill(
        ops,
        speculator,
        ops.tokens(ids),
        0,
        cache,
        step_size=step_size,
        attend=capture,
        progress=None if report is None else report.of("speculator"),
    )[-1]
    fed: list[int] = []
    for step in range(lookahead):
        token = int(np.argmax(ops.to_numpy(logits)))
        if token in stop_ids:
            break
        fed.append(token)
        wants_logits = step + 1 < lookahead  # the last fed token only contributes its query
        out = ops.forward(
            speculator, ops.tokens(np.array([token])), n_prompt + step, cache, capture, 0 if wants_logits else None
        )
        logits = out[-1] if out is not None else logits
        ops.settle([logits, capture.arrays(), cache])
        if report is not None:
            report("lookahead", step + 1, lookahead)
    queries, keys = capture.stacked(attention_layers(args)), cache.keys(n_prompt)  # a hybrid: its attention layers
    ops.settle([queries, keys])
    return SpeculatorPass(queries, keys, fed, cache, speculator, n_window)


@dataclass
class SparsePrefill(Generic[A]):
    """What the main model's sparse prefill leaves for decoding: the last kept token's logits
    [vocab] (float32), the cache (kept tokens in slots 0..K-1), the position of the first decoded
    token (the prompt length P), the selection, the speculator's pass and each part's wall time."""

    logits: A
    cache: list[Any]
    next_position: int
    selection: Selection
    speculator: SpeculatorPass[A]
    seconds: dict[str, float] = field(default_factory=dict)


def prefill_kept(
    ops: ModelOps[A],
    model: Any,
    ids: np.ndarray,
    selection: Selection,
    *,
    extra_slots: int,
    step_size: int,
    report: StageProgress | None = None,
) -> tuple[A, list[Any]]:
    """The main model's sparse prefill: the kept tokens of ids [P] into cache slots 0..K-1 at
    their original positions, room for extra_slots more: (the last kept token's logits [vocab],
    the cache). `report` is told after each prefill step (stage "main_prefill")."""
    cache = ops.new_cache(model, len(selection.kept) + extra_slots)
    logits = prefill(
        ops,
        model,
        ops.tokens(ids[selection.kept]),
        selection.position_ids,
        cache,
        step_size=step_size,
        progress=None if report is None else report.of("main_prefill"),
    )[-1]
    return logits, cache


def speculative_prefill(
    ops: ModelOps[A],
    model: Any,
    ids: np.ndarray,
    speculator: Any,
    config: SpecPrefillConfig,
    *,
    stop_ids: frozenset[int],
    extra_slots: int,
    step_size: int,
    speculator_step_size: int,
    report: StageProgress | None = None,
    speculator_extra_slots: int = 0,
) -> SparsePrefill[A]:
    """Speculate, select, then prefill the kept tokens of ids [P] (int64 NumPy) on `model`, in a
    cache with room for `extra_slots` decoded tokens after them. `report` is told after every
    step: the speculator's pass, each look-ahead token, each step of the kept tokens' prefill."""
    started = ops.wall_time()
    spec = run_speculator(
        ops,
        speculator,
        ids,
        lookahead=config.lookahead,
        stop_ids=stop_ids,
        step_size=speculator_step_size,
        report=report,
        extra_slots=speculator_extra_slots,
        query_window=config.query_window,
    )
    speculated = ops.wall_time()
    scored = attention_layers(speculator.args)  # the layers the queries and keys are of
    windows, terms = speculator.args.layer_windows, layer_terms(speculator.args)
    importance = token_importance(
        ops,
        spec.queries,
        spec.keys,
        config,
        speculator.args.attention_scale,
        [windows[i] for i in scored],
        [terms[i] for i in scored] if terms else (),
        spec.n_window,
    )
    from ..reference.specprefill import (
        select_tokens,
    )  # here: the reference package loads only when a prompt is selected

    selection = select_tokens(ops.to_numpy(importance), config)
    selected = ops.wall_time()
    logits, cache = prefill_kept(
        ops, model, ids, selection, extra_slots=extra_slots, step_size=step_size, report=report
    )
    finished = ops.wall_time()
    seconds = {
        "speculator": speculated - started,
        "selection": selected - speculated,
        "main_prefill": finished - selected,
    }
    return SparsePrefill(logits, cache, selection.decode_start, selection, spec, seconds)
