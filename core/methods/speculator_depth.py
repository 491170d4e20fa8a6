"""How much of the speculator SpecPrefill's pass runs. Layer i reads only the layers before it, so
with no look-ahead (and no drafting from its cache) the pass stops at the deepest scored layer
(`pass_depth`). With a look-ahead and SpecPrefillConfig.deep_keep the pass is nested
(`nested_split`, `DeepSubset`): its first K layers (the scored ones, layers "first-K") read every
prompt token; its deeper layers, which only make the look-ahead tokens, read the share of the
prompt its first K layers rank first.

1. The first K layers run over the prompt (dense or H2O, capturing the scored queries as the whole
   pass does), keeping their output, the deeper layers' input, for every token.
2. The first K layers' last DEEP_WINDOW prompt queries score the prompt (token_importance, the
   config's reductions); the chunks ranked first, deep_keep of them (select_tokens), plus the
   query window's tokens, are the subset.
3. The deeper layers prefill the subset's states at their ORIGINAL positions, into the next slots
   of their own caches (after a reused prefix: after its slots), attending to every slot there,
   or, with an H2O speculator pass and a subset of DEEP_H2O_FROM tokens or more, H2O-walked over
   those slots as a prompt of their own.
4. Each look-ahead token goes through the first K layers over every prompt slot (its scored
   queries captured) and through the deeper layers over the subset's; the last fed one only
   through the first K (nothing reads its deeper output), unless step 5 reads it.
5. With config.deep_from (K given apart from `layers`, so that layers past K can be scored), the
   scored layers past K keep their window and look-ahead queries too, and score over the slots
   they read (scoring.DeepScores): 0 at every prompt position outside the subset.
Without deep_from the scores are the first K layers' (window and look-ahead queries over every
prompt key), as in the whole pass; only the look-ahead tokens can differ from the whole
speculator's. Cost: about K / n + (1 - K / n) x deep_keep of the whole pass
(research/speculator_depth: at 16K, the 0.5B's first 12 of 24 layers and deep_keep 0.3 kept what
the whole pass keeps, its pass ~0.6 of it; at 32K its look-ahead lost a variable-tracking hop that
the deeper layers' own scores keep, deep_from).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from ..config import DEEP_WINDOW, H2OConfig, SpecPrefillConfig
from ..errors import ConfigError
from ..ops import ModelOps, PrefillAttention, cannot_split
from ..runtime import ProgressCallback
from ..stages import A, layer_terms
from .capture import QueryCapture, capturing_step
from .h2o import h2o_prefill
from .scoring import DeepScores, token_importance
from .selection import select_tokens


def pass_depth(n_layers: int, scored: Sequence[int], lookahead: int, extra_slots: int) -> int:
    """How many of the speculator's first layers its prompt pass runs: every one where anything
    reads past the deepest scored layer (look-ahead tokens are chosen by its logits; a speculator
    that drafts later, extra_slots > 0, decodes from its whole cache), else up to that layer:
    nothing reads the deeper layers' keys, values or outputs, so the queries, keys and selection
    are those of the whole pass (layer i depends on layers <= i only, H2O's walk too)."""
    if lookahead > 0 or extra_slots > 0 or not scored:
        return n_layers
    return max(scored) + 1


class QueryWindow(PrefillAttention[A], Protocol[A]):
    """The speculator's query capture (specprefill.QueryCapture) as the nested pass reads it."""

    def stacked(self) -> A:
        """[n_scored, n_queries, Hq, D]: the scored layers' captured queries."""


# With an H2O speculator pass, the deeper layers walk a subset of at least this many tokens by H2O
# and attend densely over a shorter one: on the pair (float32, 2 threads) the 0.5B's 12 deeper
# layers over a 4.9K subset took ~14 s more by H2O than dense at 16K, and over a 9.6K one ~25 s
# less at 32K (research/speculator_depth/README.md).
DEEP_H2O_FROM = 8192


def deep_split(deep_from: float, n_layers: int) -> int:
    """The first layer SpecPrefillConfig.deep_from names: K itself, or round(F * n_layers) (at least 1)."""
    return int(deep_from) if deep_from >= 1 else max(1, round(deep_from * n_layers))


def nested_split(
    n_layers: int, scored: Sequence[int], lookahead: int, extra_slots: int, config: SpecPrefillConfig | None
) -> int | None:
    """The speculator's first layers that read every token when its deeper ones read a subset
    (config.deep_from, else the deepest scored layer + 1), or None for a whole pass: no
    config.deep_keep, a cache kept for drafting (extra_slots: every layer's KV wanted), no layer
    past the split, or nothing past it read (no look-ahead, no scored layer there: the pass then
    stops at the scored layers, pass_depth)."""
    if config is None or config.deep_keep is None or extra_slots > 0:
        return None
    split = max(scored) + 1 if config.deep_from is None else deep_split(config.deep_from, n_layers)
    if split >= n_layers or (lookahead == 0 and max(scored) < split):
        return None
    if not any(layer < split for layer in scored):
        raise ConfigError(
            f"deep_from {split}: no scored layer below it to rank the share its layers read",
            "deep_from",
            "layers",
            config="SpecPrefillConfig",
        )
    return split


def pass_layers(
    n_layers: int, scored: Sequence[int], lookahead: int, extra_slots: int, config: SpecPrefillConfig | None
) -> tuple[int, float]:
    """What a pass reads, for cost estimates: (the first layers that run over every prompt token,
    the deeper layers' worth over a nested pass's subset: their count x deep_keep, else 0)."""
    split = nested_split(n_layers, scored, lookahead, extra_slots, config)
    if split is None:
        return pass_depth(n_layers, scored, lookahead, extra_slots), 0.0
    return split, (n_layers - split) * config.deep_keep


def capture_window(n_window: int, n_prompt: int, cached: int) -> int:
    """The prompt queries the first K layers keep: the scoring window's, and DEEP_WINDOW for the
    subset's ranking (at most the new part)."""
    return max(n_window, min(DEEP_WINDOW, n_prompt - cached))


def _slides(speculator: Any) -> bool:
    """Whether any of the speculator's layers has a sliding window (it would cut across a subset's slots)."""
    return any(window is not None for window in speculator.args.layer_windows)


def nestable(ops: ModelOps[Any], speculator: Any) -> bool:
    """Whether a nested pass can run `speculator`: a model the ops split in two (specfill's own
    families), with no sliding-window layer."""
    return ops.splits(speculator) and not _slides(speculator)


class DeepSubset:
    """The nested pass's two parts over one cache (the module doc). prefill: steps 1-3, the
    prompt's last logits; step: one look-ahead token (4); scores: the deeper scored layers'
    queries (with deep_from: step 5)."""

    def __init__(
        self,
        ops: ModelOps[A],
        speculator: Any,
        split: int,
        cache: Any,
        config: SpecPrefillConfig,
        n_window: int,
        scored: Sequence[int],
        h2o: H2OConfig | None = None,
    ):
        if not ops.splits(speculator):
            raise cannot_split()
        if _slides(speculator):
            raise ConfigError(
                "deep_keep: a nested speculator needs one without sliding-window layers",
                "deep_keep",
                config="SpecPrefillConfig",
            )
        self.ops, self.speculator, self.split, self.cache = ops, speculator, split, cache
        self.outer = ops.first_layers(speculator, split)
        self.config, self.n_window, self.h2o = config, n_window, h2o
        self.scored = [layer for layer in scored if layer < split]  # they rank the subset
        self.deep_scored = [layer for layer in scored if layer >= split]  # they score over it
        self.subset: np.ndarray | None = None  # prompt positions the deeper layers read
        self.deep_capture: QueryCapture[A] | None = None
        self.n_prompt = self.cached = 0

    def prefill(
        self,
        ids: np.ndarray,
        cached: int,
        step_size: int,
        capture: QueryWindow[A],
        window: int,
        progress: ProgressCallback | None,
    ) -> A:
        """ids [P] (the first `cached` in the cache already, in every layer), capture keeping
        `window` prompt queries (capture_window): the deeper layers' last prompt logits [vocab]."""
        ops, n_prompt = self.ops, len(ids)
        self.n_prompt, self.cached = n_prompt, cached
        states = []
        total = n_prompt - cached
        for lo in range(0, total, step_size):
            hi = min(lo + step_size, total)
            h = ops.layer_states(
                self.outer, ops.tokens(ids[cached + lo : cached + hi]), cached + lo, self.cache, capture
            )
            states.append(h)
            ops.settle([self.cache, h] + capture.arrays())
            if progress is not None:
                progress(hi, total)
        self.subset = self._subset(capture.stacked(), window, cached)
        every = ops.concat(states, axis=0) if len(states) > 1 else states[0]
        chosen = every[ops.tokens(self.subset - cached)]  # integer-array indexing: torch and MLX alike
        del every, states
        n_subset, attend, logits = len(self.subset), None, None
        if self.h2o is not None and n_subset >= DEEP_H2O_FROM:  # walked as a prompt of their own
            attend, step_size = h2o_prefill(ops, self.h2o, self.speculator.args, cached + n_subset, step_size, cached)
        if self.deep_scored:  # their window's queries kept, as the first K layers' are
            args, last = self.speculator.args, self.speculator.args.num_hidden_layers - 1
            self.deep_capture = QueryCapture(
                ops,
                args.num_hidden_layers,
                cached + n_subset,
                args.attention_scale,
                (),
                layer_terms(args),
                self.n_window,
                attend,
                self.deep_scored,
                last if attend is not None and attend.last_row_dense(last) else None,
            )
            attend = self.deep_capture
        for lo in range(0, n_subset, step_size):
            hi = min(lo + step_size, n_subset)
            logits = ops.forward_from(
                self.speculator,
                self.split,
                chosen[lo:hi],
                self.subset[lo:hi],
                self.cache,
                attend,
                -1 if hi == n_subset else None,
            )
            carries = [] if attend is None else attend.arrays()
            ops.settle([self.cache] + carries + ([] if logits is None else [logits]))
        if self.deep_capture is not None:
            self.deep_capture.prompt_attend = None  # look-ahead steps attend to every slot
        return logits[-1]

    def _subset(self, queries: A, window: int, cached: int) -> np.ndarray:
        """The prompt positions the deeper layers read: the new part's chunks the first K layers'
        last `window` queries rank first (deep_keep of them) and the scoring window's tokens."""
        args = self.speculator.args
        importance = token_importance(
            self.ops,
            queries,
            lambda layer: self.cache.layer_keys(layer, self.n_prompt),
            self.config,
            args.attention_scale,
            args.layer_windows,
            layer_terms(args),
            window,
            self.scored,
        )
        new = self.ops.to_numpy(importance)[cached:]
        inner = SpecPrefillConfig(keep_ratio=self.config.deep_keep, lookahead=0)
        chosen = select_tokens(np.asarray(new, np.float64), inner).kept + cached
        tail = np.arange(max(cached, self.n_prompt - self.n_window), self.n_prompt)
        return np.union1d(chosen, tail).astype(np.int64)

    def step(self, token: int, step: int, capture: QueryCapture[A], wants_logits: bool) -> A | None:
        """Look-ahead token `step` (position P + step): the first K layers (its queries captured),
        then, when its logits or its deeper scored queries are wanted, the deeper layers over the
        subset. Both in one of the backend's capturing steps where it has one (ModelOps.capture_step:
        each layer over its own filled slots)."""
        ops, position, one = self.ops, self.n_prompt + step, self.ops.tokens(np.array([token]))
        if wants_logits or self.deep_capture is not None:  # a step through every layer
            captures = [capture] + ([] if self.deep_capture is None else [self.deep_capture])
            logits = capturing_step(ops, self.speculator, one, position, self.cache, captures)
            if logits is not None:
                return logits
        h = ops.layer_states(self.outer, one, position, self.cache, capture)
        if not wants_logits and self.deep_capture is None:
            return None
        return ops.forward_from(
            self.speculator, self.split, h, position, self.cache, self.deep_capture, 0 if wants_logits else None
        )

    def arrays(self) -> list[A]:
        """The deeper scored layers' captured queries (a lazy backend evaluates them with each step)."""
        return [] if self.deep_capture is None else self.deep_capture.arrays()

    def scores(self) -> DeepScores[A] | None:
        """The deeper scored layers' queries and keys (None: no scored layer past the split)."""
        if self.deep_capture is None or self.subset is None:
            return None
        slots, cache = self.cached + len(self.subset), self.cache
        positions = np.concatenate([np.arange(self.cached), self.subset]).astype(np.int64)
        return DeepScores(
            self.deep_capture.stacked(), self.deep_scored, lambda layer: cache.layer_keys(layer, slots), positions
        )
