"""SpecPrefill's speculator runs only the layers something reads (core/methods/speculator_depth.pass_depth):
with no look-ahead and no drafting from its cache, its prompt pass stops after the deepest scored
layer (`layers="first-K"` makes it K layers deep). Checked on every installed backend: the deeper
layers hold none of the prompt; the queries, keys and selection equal the whole pass's and the NumPy
reference's (a speculator of those first layers); the KV kept for the conversation's next turn is
only the dense part the pass started from (the idle rebuild brings it up, as after an H2O pass).

Tolerance: 1e-5 absolute on float32 queries and keys of unit-scale tiny models: the layers kept
compute the same function of the same inputs; only the last computed layer's rows differ (which
rows it computes: core/ops.last_rows), rounding ~1e-7 per op.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.methods.specprefill import run_speculator, speculate_and_select
from specfill.core.methods.speculator_depth import pass_depth
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import KVState, PrefillMethod
from tests.fixtures.tiny_models import greedy_run
from tests.methods.support import prompt, reference_speculator

TOL = 1e-5
N = 66  # prompt tokens: steps of 32, 32, 2
H2O = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=4, layers="all")
CONFIG = SpecPrefillConfig(keep_ratio=0.3, lookahead=0, select_chunk=8, pool_kernel=3, query_window=4, layers="first-1")


def numpy(t, x) -> np.ndarray:
    return np.asarray(t.model.ops.to_numpy(x), dtype=np.float64)


def test_pass_depth():
    assert pass_depth(24, [0, 5, 13], lookahead=0, extra_slots=0) == 14
    assert pass_depth(24, [0, 5, 13], lookahead=8, extra_slots=0) == 24  # look-ahead tokens need the logits
    assert pass_depth(24, [0, 5, 13], lookahead=0, extra_slots=16) == 24  # it drafts from its cache later
    assert pass_depth(24, list(range(24)), lookahead=0, extra_slots=0) == 24


@pytest.mark.parametrize("h2o", [None, H2O], ids=["dense", "h2o"])
def test_the_pass_stops_after_the_deepest_scored_layer(tiny, h2o):
    t = tiny("qwen2")
    ops, n_layers = t.model.ops, t.args.num_hidden_layers
    assert n_layers >= 2
    ids = np.array(prompt(N, t.args.vocab_size, seed=21))

    def run(**options):
        return run_speculator(
            ops, t.model.model, ids, stop_ids=frozenset(), step_size=32, query_window=4, h2o=h2o, layers=[0], **options
        )

    short, whole = run(lookahead=0), run(lookahead=0, extra_slots=1)  # extra slots: it drafts later
    assert (short.depth, short.whole, whole.whole) == (1, False, True)
    assert [layer.offset for layer in short.cache.layers] == [N] + [0] * (n_layers - 1)
    assert [layer.offset for layer in whole.cache.layers] == [N] * n_layers
    assert np.abs(numpy(t, short.queries) - numpy(t, whole.queries)).max() < TOL
    assert np.abs(numpy(t, short.layer_keys(0)) - numpy(t, whole.layer_keys(0))).max() < TOL
    ahead = run(lookahead=2)
    assert ahead.whole and len(ahead.lookahead) == 2


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_the_selection_is_the_whole_pass_and_the_references(tiny, arch):
    t = tiny(arch)
    ids = prompt(N, t.args.vocab_size, seed=22)
    selected = {}
    for extra in (0, 1):
        spec, selection, _ = speculate_and_select(
            t.model.ops,
            t.model.model,
            np.array(ids),
            CONFIG,
            stop_ids=frozenset(),
            speculator_step_size=32,
            speculator_extra_slots=extra,
        )
        assert spec.depth == (1 if extra == 0 else t.args.num_hidden_layers)
        selected[extra] = selection.kept.tolist()
    assert selected[0] == selected[1]
    queries, keys, _ = reference_speculator(t.ref, ids, 1, 0, window=4)  # the reference's first-layer speculator
    expected = speculative_selection(queries, keys, CONFIG, t.ref.scale, REFERENCE, n_window=4)[1]
    assert selected[0] == expected.kept.tolist()


def test_the_kept_speculator_kv_is_what_the_pass_started_from(tiny):
    """A stopped-short pass keeps no speculator KV of its own prompt (its deeper layers hold none of
    it); a whole one keeps all of it; over a reused conversation the short pass keeps the dense
    speculator KV it started from."""
    t = tiny("llama")
    ids1 = prompt(60, t.args.vocab_size, seed=23)
    short = PrefillMethod("specprefill", specprefill=CONFIG, speculator=t.model)
    whole = PrefillMethod("specprefill", specprefill=replace(CONFIG, lookahead=2), speculator=t.model)
    _, first = greedy_run(t.model, ids1, short, max_tokens=3)
    assert first.kv.speculator is None
    reply, turn1 = greedy_run(t.model, ids1, whole, max_tokens=3)
    assert turn1.kv.speculator.slots == len(ids1)
    conversation = ids1 + reply
    _, rebuilt = greedy_run(t.model, conversation + [1], PrefillMethod(), max_tokens=1)
    dense = KVState(rebuilt.kv.cache, len(conversation), speculator=turn1.kv.speculator)
    _, turn2 = greedy_run(
        t.model, conversation + prompt(40, t.args.vocab_size, seed=24), short, reuse=dense, max_tokens=3
    )
    assert turn2.kv.speculator is not None and turn2.kv.speculator.slots == len(ids1)
