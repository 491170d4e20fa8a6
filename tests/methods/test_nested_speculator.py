"""A nested speculator (SpecPrefillConfig.deep_keep, core/methods/speculator_depth.py): its first
K layers (layers "first-K") read every prompt token, its deeper layers, which only make the
look-ahead tokens, the share its first K layers rank first. Checked on every installed backend
against the NumPy reference's nested pass (core/reference/model.nested_speculator_pass: every step
recomputed, the deeper layers over the subset's rows): the look-ahead tokens, the first K layers'
queries and the selection; with deep_keep 1 it is the whole pass; the model split in two
(layer_states, forward_from) is the model; the KV kept for the next turn is the dense start only.

Tolerance: 1e-4 absolute on float32 queries and logits of unit-scale tiny models against the
float64 reference (the same functions of the same inputs; rounding ~1e-6 per layer), 1e-5 between
two float32 runs of the same layers.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.config import DEEP_WINDOW, H2OConfig, SpecPrefillConfig
from specfill.core.errors import ConfigError
from specfill.core.methods import speculator_depth
from specfill.core.methods.prefill import prefill
from specfill.core.methods.specprefill import expected_work, run_speculator, speculate_and_select, token_importance
from specfill.core.methods.speculator_depth import nestable, nested_split
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import (
    nested_scores,
    score_tokens,
    select_new_tokens,
    select_tokens,
    speculative_selection,
)
from specfill.core.runtime import PrefillMethod
from tests.fixtures.tiny_models import greedy_run
from tests.methods.support import prompt

TOL, SAME = 1e-4, 1e-5
N = 70  # prompt tokens: steps of 32, 32, 6
CONFIG = SpecPrefillConfig(
    keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3, query_window=4, layers="first-1", deep_keep=0.4
)
H2O = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=4, layers="all")


def numpy(t, x) -> np.ndarray:
    return np.asarray(t.model.ops.to_numpy(x), dtype=np.float64)


def test_when_the_pass_is_nested():
    nested = replace(CONFIG, layers="first-12")
    assert nested_split(24, range(12), 8, 0, nested) == 12
    assert nested_split(24, range(12), 8, 0, replace(nested, deep_keep=None)) is None
    assert nested_split(24, range(12), 0, 0, nested) is None  # no look-ahead: the pass stops at layer 12
    assert nested_split(24, range(12), 8, 16, nested) is None  # it drafts later from every layer's KV
    assert nested_split(12, range(12), 8, 0, nested) is None  # no deeper layer
    assert nested_split(24, range(12), 8, 0, None) is None
    every = replace(CONFIG, layers="all", deep_from=12)
    assert nested_split(24, range(24), 8, 0, every) == 12
    assert nested_split(24, range(24), 0, 0, every) == 12  # no look-ahead: the deeper layers still score
    assert nested_split(24, range(12), 0, 0, every) is None  # nothing reads past layer 12
    assert nested_split(24, range(24), 8, 0, replace(every, deep_from=24)) is None  # no deeper layer
    half = replace(every, deep_from=0.5)
    assert half.deep_from == 0.5 and nested_split(24, range(24), 8, 0, half) == 12
    assert replace(every, deep_from=12.0).deep_from == 12  # an index, given as a float (the CLI's)
    with pytest.raises(ConfigError, match="deep_from") as err:  # nothing below the split ranks the share
        nested_split(24, range(12, 24), 8, 0, every)
    assert err.value.fields == ("deep_from", "layers")


def test_progress_counts_the_deeper_layers_on_their_share(tiny):
    args = tiny("llama").args  # 2 layers: the first reads every token, the second 0.4 of them
    whole = expected_work(args, args, 1000, replace(CONFIG, deep_keep=None))
    nested = expected_work(args, args, 1000, CONFIG)
    assert nested["speculator"] == pytest.approx(whole["speculator"] * (1 + 0.4) / 2)
    assert nested["main_prefill"] == whole["main_prefill"]


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"deep_keep": 0.3}, ("deep_keep", "layers")),  # layers "all": no deeper layers to nest
        ({"deep_keep": 0.3, "layers": "last-2"}, ("deep_keep", "layers")),
        ({"deep_keep": 0.0, "layers": "first-2"}, ("deep_keep",)),
        ({"deep_keep": 1.5, "layers": "first-2"}, ("deep_keep",)),
        ({"deep_keep": True, "layers": "first-2"}, ("deep_keep",)),
        ({"deep_from": 12}, ("deep_from", "deep_keep")),  # no share for its layers to read
        ({"deep_from": 0, "deep_keep": 0.3}, ("deep_from",)),
        ({"deep_from": True, "deep_keep": 0.3}, ("deep_from",)),
        ({"deep_from": 12.5, "deep_keep": 0.3}, ("deep_from",)),  # neither an index nor a share
        ({"deep_from": float("nan"), "deep_keep": 0.3}, ("deep_from",)),
    ],
)
def test_bad_settings_name_the_field(fields, named):
    with pytest.raises(ConfigError) as err:
        SpecPrefillConfig(**fields)
    assert err.value.fields == named and named[0] in str(err.value)


def _speculate(t, ids, config, reused=0):
    """speculate_and_select on the tiny model as its own speculator: (the pass, the selection);
    reused > 0: over the speculator's dense KV of the first `reused` tokens (a cached conversation)."""
    ops, model = t.model.ops, t.model.model
    cache = None
    if reused:
        cache = ops.new_cache(model, len(ids) + 3)
        prefill(ops, model, ops.tokens(np.array(ids[:reused])), 0, cache, step_size=32)
    spec, selection, _ = speculate_and_select(
        ops,
        model,
        np.array(ids),
        config,
        stop_ids=frozenset(),
        speculator_step_size=32,
        reused=reused,
        speculator_cache=None if cache is None else (cache, reused),
    )
    return spec, selection


def _subset_rule(t, config, n_prompt, cached=0):
    """The reference's ranking of what the deeper layers read (the module doc's step 2)."""
    inner = SpecPrefillConfig(keep_ratio=config.deep_keep, lookahead=0)
    window = max(config.query_window, min(DEEP_WINDOW, n_prompt - cached))

    def subset_of(queries, keys):
        importance = score_tokens(queries, keys, config, t.ref.scale, REFERENCE, n_window=window).importance
        chosen = select_tokens(importance[cached:], inner).kept + cached
        tail = np.arange(max(cached, n_prompt - min(config.query_window, n_prompt - cached)), n_prompt)
        return np.union1d(np.union1d(np.arange(cached), chosen), tail)

    return subset_of, window


@pytest.mark.parametrize(
    "arch, h2o",
    [("llama", None), ("qwen2", None), ("qwen3", None), ("qwen2", H2O)],
    ids=["llama", "qwen2", "qwen3", "h2o"],
)
def test_the_nested_pass_is_the_references(tiny, arch, h2o, monkeypatch):
    """With an H2O speculator pass the deeper layers walk the subset's slots by H2O (the
    reference: its walk over the subset's rows alone), from DEEP_H2O_FROM tokens (here: any)."""
    monkeypatch.setattr(speculator_depth, "DEEP_H2O_FROM", 1)
    t = tiny(arch)
    ids = prompt(N, t.args.vocab_size, seed=31)
    config = replace(CONFIG, speculator_prefill=h2o)
    spec, selection, _ = speculate_and_select(
        t.model.ops, t.model.model, np.array(ids), config, stop_ids=frozenset(), speculator_step_size=32
    )
    subset_of, window = _subset_rule(t, CONFIG, N)
    queries, keys, fed, subset, _, _ = t.ref.nested_speculator_pass(
        ids, 1, 3, subset_of, window=4, rank_window=window, h2o_config=h2o
    )
    assert 0 < len(subset) < N
    assert spec.lookahead == fed and (spec.depth, spec.whole) == (1, False)
    # the deeper layer holds the subset and every fed token but the last (nothing reads its output)
    assert [layer.offset for layer in spec.cache.layers] == [N + len(fed), len(subset) + len(fed) - 1]
    assert np.abs(numpy(t, spec.queries) - queries).max() < TOL
    expected = speculative_selection(queries, keys, CONFIG, t.ref.scale, REFERENCE, n_window=4)[1]
    assert selection.kept.tolist() == expected.kept.tolist()


DEEP = replace(CONFIG, layers="all", deep_from=1)  # layer 0 reads every token, layer 1 the share; both score


@pytest.mark.parametrize(
    "arch, h2o, reused, lookahead",
    [
        ("llama", None, 0, 3),
        ("qwen2", None, 0, 3),
        ("qwen3", None, 0, 3),
        ("qwen2", H2O, 0, 3),
        ("llama", None, 30, 3),
        ("qwen2", None, 0, 0),
    ],
    ids=["llama", "qwen2", "qwen3", "h2o", "reused", "no-lookahead"],
)
def test_deeper_scored_layers_are_the_references(tiny, arch, h2o, reused, lookahead, monkeypatch):
    """deep_from: the scored layers past the split score over the subset's keys (0 at every other
    position), held to the reference's nested pass and nested_scores; from a reused prefix the
    deeper layers read all of it and the new part's subset."""
    monkeypatch.setattr(speculator_depth, "DEEP_H2O_FROM", 1)
    t = tiny(arch)
    ids = prompt(N, t.args.vocab_size, seed=36)
    spec, selection = _speculate(t, ids, replace(DEEP, speculator_prefill=h2o, lookahead=lookahead), reused)
    subset_of, window = _subset_rule(t, DEEP, N, cached=reused)
    ref = t.ref.nested_speculator_pass(ids, 1, lookahead, subset_of, window=4, rank_window=window, h2o_config=h2o)
    assert spec.lookahead == ref.fed and spec.layers == [0] and spec.deep.layers == [1]
    assert spec.deep.positions.tolist() == ref.subset.tolist()
    # every fed token, the last too, went through the deeper layer (its query scores)
    assert spec.cache.layers[1].offset == len(ref.subset) + len(ref.fed)
    assert np.abs(numpy(t, spec.queries) - ref.queries).max() < TOL
    assert np.abs(numpy(t, spec.deep.queries) - ref.deep_queries).max() < TOL
    importance = nested_scores(
        ref.queries, ref.keys, ref.deep_queries, ref.deep_keys, ref.subset, DEEP, t.ref.scale, REFERENCE, n_window=4
    )
    expected = select_new_tokens(importance, reused, DEEP)
    assert selection.kept.tolist() == expected.kept.tolist()


def test_deeper_scores_over_every_token_are_the_whole_pass(tiny):
    """deep_keep 1 with deep_from: every layer reads every token, so the importance is the whole
    pass's, every layer scored."""
    t = tiny("qwen2")
    ids = np.array(prompt(N, t.args.vocab_size, seed=37))

    def importance(config):
        spec, selection, _ = speculate_and_select(
            t.model.ops, t.model.model, ids, config, stop_ids=frozenset(), speculator_step_size=32
        )
        scores = token_importance(
            t.model.ops,
            spec.queries,
            spec.layer_keys,
            config,
            t.ref.scale,
            n_window=spec.n_window,
            layers=spec.layers,
            deep=spec.deep,
        )
        return spec, numpy(t, scores), selection.kept.tolist()

    nested, nested_scores_, nested_kept = importance(replace(DEEP, deep_keep=1.0))
    whole, whole_scores, whole_kept = importance(replace(DEEP, deep_keep=None, deep_from=None))
    assert nested.deep is not None and whole.deep is None and nested.lookahead == whole.lookahead
    assert np.abs(nested_scores_ - whole_scores).max() < SAME
    assert nested_kept == whole_kept


@pytest.mark.parametrize("h2o", [None, H2O], ids=["dense", "h2o"])
def test_with_every_token_it_is_the_whole_pass(tiny, h2o, monkeypatch):
    monkeypatch.setattr(speculator_depth, "DEEP_H2O_FROM", 1)  # an H2O pass's deeper layers walk by H2O too
    t = tiny("qwen2")
    ids = np.array(prompt(N, t.args.vocab_size, seed=32))

    def run(nest):
        return run_speculator(
            t.model.ops,
            t.model.model,
            ids,
            lookahead=3,
            stop_ids=frozenset(),
            step_size=32,
            query_window=4,
            h2o=h2o,
            layers=[0],
            nest=nest,
        )

    nested, whole = run(replace(CONFIG, deep_keep=1.0)), run(None)
    assert nested.depth == 1 and whole.whole
    assert nested.lookahead == whole.lookahead
    assert np.abs(numpy(t, nested.queries) - numpy(t, whole.queries)).max() < SAME


def test_the_model_split_in_two_is_the_model(tiny):
    t = tiny("qwen3")
    ops, model = t.model.ops, t.model.model
    ids = ops.tokens(np.array(prompt(20, t.args.vocab_size, seed=33)))
    whole = ops.new_cache(model, 20)
    logits = ops.forward(model, ids, 0, whole, None, 0)
    split = ops.new_cache(model, 23)
    states = ops.layer_states(ops.first_layers(model, 1), ids, 0, split, None)
    assert tuple(states.shape) == (20, t.args.hidden_size)
    again = ops.forward_from(model, 1, states, np.arange(20), split, None, 0)
    assert np.abs(numpy(t, again) - numpy(t, logits)).max() < SAME
    assert ops.forward_from(model, 1, states[:3], np.arange(20, 23), split, None, None) is None


def test_from_a_reused_prefix_the_deeper_layers_read_it_whole(tiny):
    """SpecPrefill over a cached conversation: the speculator's dense KV of the first R tokens is
    reused in every layer; the deeper layers read all of it and the new part's subset."""
    t = tiny("llama")
    ids, reused = prompt(N, t.args.vocab_size, seed=34), 30
    spec, selection = _speculate(t, ids, CONFIG, reused)
    subset_of, window = _subset_rule(t, CONFIG, N, cached=reused)
    queries, keys, fed, subset, _, _ = t.ref.nested_speculator_pass(ids, 1, 3, subset_of, window=4, rank_window=window)
    assert spec.lookahead == fed
    assert spec.cache.layers[1].offset == len(subset) + len(fed) - 1
    assert np.abs(numpy(t, spec.queries) - queries).max() < TOL
    expected = speculative_selection(queries, keys, CONFIG, t.ref.scale, REFERENCE, n_window=4, reused=reused)[1]
    assert selection.kept.tolist() == expected.kept.tolist()


def test_the_kept_speculator_kv_is_the_dense_start_only(tiny):
    """After a nested pass the speculator's deeper layers hold only the subset: nothing of the
    prompt is kept for the next turn (the idle rebuild brings it up, as after an H2O pass)."""
    t = tiny("qwen2")
    ids = prompt(60, t.args.vocab_size, seed=35)
    nested = PrefillMethod("specprefill", specprefill=CONFIG, speculator=t.model)
    reply, run = greedy_run(t.model, ids, nested, max_tokens=3)
    assert run.kv.speculator is None and len(reply) == 3


def test_a_speculator_with_sliding_windows_is_refused(tiny_windowed):
    model = tiny_windowed
    with pytest.raises(ConfigError, match="deep_keep") as err:
        run_speculator(
            model.ops,
            model.model,
            np.arange(1, 41),
            lookahead=2,
            stop_ids=frozenset(),
            step_size=32,
            layers=[0],
            nest=CONFIG,
        )
    assert err.value.fields == ("deep_keep",)


def test_which_speculators_nest(tiny, tiny_windowed):
    """auto's composition nests where the speculator can (core/probe.auto_options): specfill's own
    families; on MLX not a "self:K" view (no deeper blocks of its own); never sliding windows."""
    t = tiny("llama")
    ops, model = t.model.ops, t.model.model
    assert nestable(ops, model)
    assert nestable(ops, ops.first_layers(model, 1)) == (ops.name == "cuda")
    assert not nestable(tiny_windowed.ops, tiny_windowed.model)


@pytest.fixture
def tiny_windowed(backend):
    pytest.importorskip("transformers")
    from tests.test_sliding_window_methods import backend_model
    from tests.torch_cuda.tiny_torch_models import make_tiny

    return backend_model(make_tiny("mistral", seed=7), backend)
