"""Speculative prefill (seed 002), written once over `ModelOps`.

1. The speculator runs the whole prompt (full attention) and keeps, per layer, the post-RoPE
   queries of the last W prompt tokens (config.query_window; 1, the paper's: the last token
   only); it then decodes up to `lookahead` greedy tokens, feeding each one that is not a stop id
   and keeping its query too. Its KV cache holds the prompt keys. With no look-ahead (and no
   drafting from its cache later) nothing reads the layers past the deepest scored one, and the
   pass stops there (`pass_depth`: config.layers "first-K" makes the speculator K layers deep).
2. The W + N' queries score the prompt positions: softmax over the prompt keys per scoring query
   (an observation window's query over the keys at or before its own position),
   average pooling along positions, a head reduction and a layer reduction, then the queries'
   reduction (config.lookahead_reduction: mean, or max).
3. Whole selection chunks are kept (NumPy, float64 chunk means: core/methods/selection.py),
   and the main model prefills only the kept tokens, into cache slots 0..K-1 at their ORIGINAL
   position ids; decoding continues at position P (the prompt length), slot K.
With config.speculator_prefill (an H2OConfig) the speculator's prompt pass of step 1 runs H2O
(core/methods/h2o.py) instead of full attention; the queries are captured as before and the
look-ahead steps attend to the speculator's whole cache, so step 2 still scores every prompt key
(docs/methods.md: what is exact, what is approximated).
Sliding layers: the speculator attends and scores inside its own windows; the main model's
sliding layers apply theirs over ORIGINAL positions, not over kept-token counts (its cache
records each slot's position). A layer's attention terms (soft-cap, sinks: core/stages.AttentionTerms)
enter the speculator's attention and the scoring softmaxes alike (layer_terms, like the windows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence

import numpy as np

from ..config import H2OConfig, SpecPrefillConfig
from ..errors import ConfigError
from ..ops import ModelOps
from ..stages import (
    A,
    Selection,
    attention_layers,
    layer_terms,
)
from .capture import QueryCapture, capturing_step  # re-exported: the speculator's capture is part of this method
from .h2o import h2o_prefill
from .prefill import StageProgress, prefill, stage_work
from .scoring import DeepScores, token_importance  # token_importance re-exported: the scoring is part of this method
from .selection import select_new_tokens
from .speculator_depth import DeepSubset, capture_window, pass_layers


@dataclass
class SpeculatorPass(Generic[A]):
    """queries [n_l, W + N', Hq, D] (the prompt's last W tokens, then the fed look-ahead tokens) of
    the speculator layers `layers` (None: every layer, row i layer i); lookahead the fed tokens;
    cache the speculator's KV cache (prompt, then look-ahead slots), kept for a later use as a draft
    model; n_window: W (the query window, clamped to the prompt); n_prompt: P; depth: the first
    layers its prompt pass ran (pass_depth: the deeper layers' slots of this prompt are not filled)."""

    queries: A
    lookahead: list[int]
    cache: Any
    model: Any
    n_window: int = 1
    n_prompt: int = 0
    layers: list[int] | None = None
    depth: int | None = None  # the first layers the prompt pass ran (pass_depth); None: every layer
    deep: DeepScores[A] | None = None  # a nested pass's deeper scored layers (over its subset)
    pass_seconds: float = 0.0  # the prompt pass's wall time, the look-ahead after it apart
    lookahead_setup_seconds: float = 0.0  # of the look-ahead's time, preparing its steps (graph captures)

    @property
    def whole(self) -> bool:
        """Whether the pass ran every layer (its cache then holds the whole speculator's KV of the prompt)."""
        return self.depth is None or self.depth == self.model.args.num_hidden_layers

    @property
    def keys(self) -> A:
        """[n_l, Hkv, P, D]: every layer's prompt keys (on MLX and NumPy a stacked copy of them;
        speculative_prefill's scoring reads layer_keys, one layer at a time, instead)."""
        return self.cache.keys(self.n_prompt)

    def layer_keys(self, layer: int) -> A:
        """[1, Hkv, P, D]: one layer's prompt keys, no copy."""
        return self.cache.layer_keys(layer, self.n_prompt)


def scoring_layers(config: SpecPrefillConfig, args: Any) -> list[int]:
    """The speculator layers SpecPrefill scores from: config.layers picks among the layers with
    keys (a hybrid's attention layers; every layer otherwise), given as model layer indices."""
    attention = attention_layers(args)
    return [attention[i] for i in config.layer_indices(len(attention))]


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
    h2o: H2OConfig | None = None,
    layers: Sequence[int] | None = None,
    cache: Any = None,
    cached: int = 0,
    nest: SpecPrefillConfig | None = None,
) -> SpeculatorPass[A]:
    """Full prefill of ids [P] on the speculator (H2O prefill with `h2o`), then greedy look-ahead
    (see the module doc).

    The look-ahead stops early at a stop id (which is not fed); `lookahead` fits the speculator's
    context (core/request.fit_lookahead: a run's config comes clamped by fit_to_prompt).
    extra_slots: cache room after the prompt beyond the look-ahead (the speculator drafting later).
    report: told after each step of the pass ("speculator") and each fed token ("lookahead").
    query_window: the prompt's last tokens whose queries are kept (at most the prompt).
    layers: the speculator layers whose queries are kept (None: every layer's).
    cache, cached: the speculator's own dense KV of the prompt's first `cached` tokens (SpecPrefill
    from a reused prefix, docs/methods.md): cut to them, grown as needed, and only ids[cached:] are
    prefilled (with `h2o`: H2O walked from that prefix, as the main model's H2O from a reused
    prefix); the window stays inside them. None: a new cache.
    nest: a config with deep_keep makes the pass nested where nested_split says (its deeper layers
    read a subset ranked with nest's reductions: core/methods/speculator_depth.py).
    """
    began, n_prompt, args = ops.wall_time(), len(ids), speculator.args
    captured = attention_layers(args) if layers is None else layers  # a hybrid's recurrent layers have no queries
    depth, deeper = pass_layers(args.num_hidden_layers, captured, lookahead, extra_slots, nest)
    split = depth if deeper else None  # nested: the first `depth` layers read every token, the deeper ones a subset
    outer = captured if split is None else [layer for layer in captured if layer < split]
    n_window = max(1, min(query_window, n_prompt - cached))
    window = n_window if split is None else capture_window(n_window, n_prompt, cached)
    needed = n_prompt + max(lookahead, extra_slots)
    if cache is None:
        cache = ops.new_cache(speculator, needed)
    else:
        if not 0 <= cached < n_prompt:
            raise ConfigError(f"a speculator cache of {cached} tokens (dense) cannot start a {n_prompt}-token pass")
        cache.truncate(cached)
        cache = cache if cache.capacity >= needed else cache.grown(needed)
    sparse = None
    if h2o is not None:  # H2O steps by whole chunks
        sparse, step_size = h2o_prefill(ops, h2o, args, n_prompt, step_size, origin=cached)
    final = depth - 1
    capture = QueryCapture(
        ops,
        args.num_hidden_layers,
        n_prompt,
        args.attention_scale,
        args.layer_windows,
        layer_terms(args),
        window,
        sparse,
        outer,
        final if split is None and sparse is not None and sparse.last_row_dense(final) else None,
    )
    progress = None if report is None else report.of("speculator")
    if split is None:
        logits = prefill(
            ops,
            speculator if depth == args.num_hidden_layers else ops.first_layers(speculator, depth),
            ops.tokens(ids[cached:]),
            cached,
            cache,
            step_size=step_size,
            attend=capture,
            progress=progress,
        )[-1]
    else:
        nested = DeepSubset(ops, speculator, split, cache, nest, n_window, captured, h2o)
        logits = nested.prefill(ids, cached, step_size, capture, window, progress)
    capture.prompt_attend = None  # the H2O carries (scores, memory sets) are not read again
    pass_seconds = ops.wall_time() - began  # the backend's clock waits for the device
    setup_before = ops.decode_setup_seconds()  # the look-ahead's static steps are captured per prompt
    fed: list[int] = []
    for step in range(lookahead):
        token = int(np.argmax(ops.to_numpy(logits)))
        if token in stop_ids:
            break
        fed.append(token)
        wants_logits = step + 1 < lookahead  # the last fed token only contributes its query
        if split is None:
            one, position = ops.tokens(np.array([token])), n_prompt + step
            out = capturing_step(ops, speculator, one, position, cache, [capture])
            if out is None:
                out = ops.forward(speculator, one, position, cache, capture, 0 if wants_logits else None)
        else:
            out = nested.step(token, step, capture, wants_logits)
        logits = out[-1] if out is not None else logits
        ops.settle([logits, capture.arrays(), cache] + ([] if split is None else nested.arrays()))
        if report is not None:
            report("lookahead", step + 1, lookahead)
    queries = capture.stacked()
    if window > n_window:  # the subset's ranking window: only the scoring window's queries are returned
        queries = queries[:, window - n_window :]
    ops.settle([queries])
    rows = None if split is None and layers is None else list(outer)  # the layers of `queries` (None: every one)
    deep = None if split is None else nested.scores()
    setup = ops.decode_setup_seconds() - setup_before
    return SpeculatorPass(queries, fed, cache, speculator, n_window, n_prompt, rows, depth, deep, pass_seconds, setup)


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
    cache: Any = None,
) -> tuple[A, list[Any]]:
    """The main model's sparse prefill: the kept tokens of ids [P] into cache slots 0..K-1 at
    their original positions, room for extra_slots more: (the last kept token's logits [vocab],
    the cache). `report` is told after each prefill step (stage "main_prefill"). cache: a reused
    dense prefix's (room made by the caller): the kept tokens go after its filled slots."""
    if cache is None:
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


def expected_work(model_args: Any, speculator_args: Any, n_prompt: int, config: SpecPrefillConfig) -> dict[str, float]:
    """Each stage's expected work (StageProgress.plan): the speculator's pass over the prompt, its
    look-ahead tokens, then the scoring (every scoring query against every prompt key, per scoring
    layer and head) with the main model's prefill of the kept tokens (what the keep setting keeps,
    at most, before neighbours), the scoring reported with its first step. The last stage takes
    whatever share is left (StageProgress), so only the earlier stages' estimates move the bar."""
    n_chunks = -(-n_prompt // config.select_chunk)
    kept = min(n_prompt, config.n_kept_chunks(n_chunks) * config.select_chunk)
    n_queries = config.query_window + config.lookahead
    heads = speculator_args.num_attention_heads * speculator_args.head_dim
    scored = scoring_layers(config, speculator_args)
    scoring = 2.0 * len(scored) * n_queries * heads * n_prompt
    n_layers = speculator_args.num_hidden_layers
    depth, deep = pass_layers(n_layers, scored, config.lookahead, 0, config)
    return {
        "speculator": stage_work(speculator_args, n_prompt, n_prompt / 2) * (depth + deep) / n_layers,
        "lookahead": stage_work(speculator_args, config.lookahead, n_prompt),
        "main_prefill": scoring + stage_work(model_args, kept, kept / 2),
    }


def speculate_and_select(
    ops: ModelOps[A],
    speculator: Any,
    ids: np.ndarray,
    config: SpecPrefillConfig,
    *,
    stop_ids: frozenset[int],
    speculator_step_size: int,
    report: StageProgress | None = None,
    speculator_extra_slots: int = 0,
    reused: int = 0,
    speculator_cache: tuple[Any, int] | None = None,
) -> tuple[SpeculatorPass[A], Selection, dict[str, float]]:
    """What decides SpecPrefill's kept set, no main model: the speculator's pass over ids [P]
    (H2O with config.speculator_prefill) and look-ahead, the scoring and the selection: (the
    pass, the selection, each part's wall time). speculative_prefill runs it, then the main
    model's prefill of the kept tokens. reused: the prompt's first tokens the main model has
    cached densely (SpecPrefill from a reused prefix, docs/methods.md): only the later ones are
    selected from, and the window stays inside them; speculator_cache: (the speculator's own cache,
    the tokens of it to reuse)."""
    started = ops.wall_time()
    prior, cached = speculator_cache if speculator_cache is not None else (None, 0)
    spec = run_speculator(
        ops,
        speculator,
        ids,
        lookahead=config.lookahead,
        stop_ids=stop_ids,
        step_size=speculator_step_size,
        report=report,
        extra_slots=speculator_extra_slots,
        query_window=config.query_window if reused == 0 else min(config.query_window, len(ids) - reused),
        h2o=config.speculator_prefill,
        layers=scoring_layers(config, speculator.args),
        cache=prior,
        cached=min(cached, reused),
        nest=config,
    )
    speculated = ops.wall_time()
    importance = token_importance(
        ops,
        spec.queries,
        spec.layer_keys,
        config,
        speculator.args.attention_scale,
        speculator.args.layer_windows,
        layer_terms(speculator.args),
        spec.n_window,
        spec.layers,
        spec.deep,
    )
    selection = select_new_tokens(ops.to_numpy(importance), reused, config)
    seconds = {
        "speculator": speculated - started,  # the prompt pass and the look-ahead
        "speculator_pass": spec.pass_seconds,
        "selection": ops.wall_time() - speculated,
    }
    if spec.lookahead_setup_seconds:  # a GPU's graph captures (decode_setup_seconds), as decoding's "setup"
        seconds["lookahead_setup"] = spec.lookahead_setup_seconds
    return spec, selection, seconds


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
    reused: int = 0,
    main_cache: Callable[[int], Any] | None = None,
    speculator_cache: tuple[Any, int] | None = None,
) -> SparsePrefill[A]:
    """Speculate, select, then prefill the kept tokens of ids [P] (int64 NumPy) on `model`, in a
    cache with room for `extra_slots` decoded tokens after them. `report` is told after every
    step: the speculator's pass, each look-ahead token, each step of the kept tokens' prefill.
    From a reused prefix (docs/methods.md): `reused` tokens cached densely by the main model in
    `main_cache(room)` (the reused cache with room for `room` more slots), selected from the new
    part only; speculator_cache as speculate_and_select's."""
    if report is not None:
        report.plan(expected_work(model.args, speculator.args, len(ids), config))
    spec, selection, seconds = speculate_and_select(
        ops,
        speculator,
        ids,
        config,
        stop_ids=stop_ids,
        speculator_step_size=speculator_step_size,
        report=report,
        speculator_extra_slots=speculator_extra_slots,
        reused=reused,
        speculator_cache=speculator_cache,
    )
    selected = ops.wall_time()
    prefix = None if main_cache is None else main_cache(len(selection.kept) + extra_slots)
    logits, cache = prefill_kept(
        ops, model, ids, selection, extra_slots=extra_slots, step_size=step_size, report=report, cache=prefix
    )
    finished = ops.wall_time()
    seconds["main_prefill"] = finished - selected
    return SparsePrefill(logits, cache, selection.decode_start, selection, spec, seconds)
