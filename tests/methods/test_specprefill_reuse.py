"""SpecPrefill from a reused prefix (docs/methods.md, issue 46) inside each backend's model: the
dense prefix untouched, the speculator on its own KV of the conversation, the selection over the new
part only, the kept new tokens at their original positions over the whole prefix; against the
reference speculator's whole-prompt pass and the oracle's dense forward over prefix + kept tokens."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import ConfigError
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from tests.methods.support import assert_logits_close, prompt, reference_speculator, tolerance

# chunks of 8 with a memory of 4: the speculator's H2O walk over a 60-token new part differs from a dense pass
SPECULATOR_H2O = H2OConfig(chunk_size=8, batch_size=16, local=2, heavy=2, dense_tail=4, layers="all")
CONFIG = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3, query_window=4)
METHOD = PrefillMethod("specprefill", specprefill=CONFIG, speculator="self:1")


def run(model, ids, method, info, reuse=None, max_tokens=4):
    return list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=method,
            info=info,
            reuse=reuse,
        )
    )


def oracle_greedy(t, ids, reused, kept, n):
    """Greedy decoding of the reference over the dense prefix and the kept tokens at their positions."""
    context, positions, tokens = list(ids[:reused]) + [ids[i] for i in kept], list(range(reused)) + kept, []
    for step in range(n):
        logits = t.ref.forward(context + tokens, positions + list(range(len(ids), len(ids) + step)))[-1]
        tokens.append(int(logits.argmax()))
    return tokens


def expected_kept(t, ids, reused):
    queries, keys, _ = reference_speculator(t.ref, ids, 1, CONFIG.lookahead, window=min(4, len(ids) - reused))
    n_window = min(4, len(ids) - reused)
    return speculative_selection(queries, keys, CONFIG, t.ref.scale, REFERENCE, n_window=n_window, reused=reused)[
        1
    ].kept.tolist()


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_the_new_part_is_selected_and_prefilled_over_the_dense_prefix(tiny, arch):
    t = tiny(arch)
    ids, reused = prompt(100, t.args.vocab_size, seed=6), 44
    first = GenerationInfo()
    run(t.model, ids[:reused], PrefillMethod(), first, max_tokens=1)
    assert (first.kv.slots, first.kv.position_offset, first.kv.speculator) == (reused, 0, None)
    prefix_keys = np.array(t.model.ops.to_numpy(first.kv.cache.keys(reused)))
    info = GenerationInfo()
    tokens = run(t.model, ids, METHOD, info, reuse=first.kv)
    assert info.kept_positions[:reused] == list(range(reused)) and info.kept_tokens == len(info.kept_positions)
    kept = info.kept_positions[reused:]  # the new part's
    assert kept == expected_kept(t, ids, reused) and kept[0] >= reused and kept[-1] == len(ids) - 1
    assert reused + 8 < reused + len(kept) < len(ids)
    assert tokens == oracle_greedy(t, ids, reused, kept, len(tokens))
    np.testing.assert_array_equal(t.model.ops.to_numpy(info.kv.cache.keys(reused)), prefix_keys)
    kv = info.kv
    assert (kv.prefix, kv.tokens, kv.slots) == (
        reused,
        len(ids) + len(tokens) - 1,
        reused + len(kept) + len(tokens) - 1,
    )
    positions = kv.positions(kept).tolist()
    assert positions == list(range(reused)) + kept + list(range(len(ids), kv.tokens))
    assert kv.speculator is not None and kv.speculator.slots == len(ids)


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_a_second_turn_reuses_the_first_and_its_speculator_kv(tiny, arch):
    """Turn 1 SpecPrefill (its speculator KV kept), its main KV rebuilt densely (the exact policy's
    idle rebuild), turn 2 = turn 1 + reply + a new part: the speculator prefills only from turn 1's
    prompt on, the main model only kept tokens of the new part; as the reference over the whole prompt."""
    t = tiny(arch)
    ids1 = prompt(70, t.args.vocab_size, seed=11)
    turn1 = GenerationInfo()
    reply = run(t.model, ids1, METHOD, turn1, max_tokens=5)
    assert turn1.kv.prefix == 0 and turn1.kv.position_offset > 0 and turn1.kv.speculator.slots == len(ids1)
    conversation = ids1 + reply
    rebuilt = GenerationInfo()
    run(t.model, conversation + [1], PrefillMethod(), rebuilt, max_tokens=1)
    dense = KVState(rebuilt.kv.cache, len(conversation), speculator=turn1.kv.speculator)
    ids2 = conversation + prompt(60, t.args.vocab_size, seed=12)
    read: list[tuple[str, int, int]] = []
    turn2 = GenerationInfo()
    method = PrefillMethod("specprefill", specprefill=CONFIG, speculator="self:1")
    tokens = list(
        t.model.generate_step(
            ids2,
            max_tokens=4,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=method,
            info=turn2,
            reuse=dense,
            progress=lambda done, total: read.append((turn2.step.stage, done, total)),
        )
    )
    assert [r for r in read if r[0] == "speculator"][-1][1:] == (len(ids2) - len(ids1),) * 2
    kept = turn2.kept_positions[len(conversation) :]
    assert kept == expected_kept(t, ids2, len(conversation)) and kept[0] >= len(conversation)
    assert tokens == oracle_greedy(t, ids2, len(conversation), kept, len(tokens))
    assert turn2.kv.speculator.slots == len(ids2)  # (a grown copy of turn 1's: its room was the look-ahead's)


def test_what_a_reused_prefix_does_not_support_is_refused(tiny):
    t = tiny("llama")
    ids = prompt(50, t.args.vocab_size, seed=3)
    sparse = GenerationInfo()
    run(t.model, ids[:30], METHOD, sparse, max_tokens=1)
    with pytest.raises(ConfigError, match="from SpecPrefill"):
        run(t.model, ids, METHOD, GenerationInfo(), reuse=sparse.kv)
    dense = GenerationInfo()
    run(t.model, ids[:30], PrefillMethod(), dense, max_tokens=1)
    two_layers = KVState(dense.kv.cache, 30, speculator=KVState(dense.kv.cache, 30))
    with pytest.raises(ConfigError, match="speculator KV has 2 layers"):
        run(t.model, ids, METHOD, GenerationInfo(), reuse=two_layers)


def dense_turn1(t, ids1, method=METHOD):
    """Turn 1 by SpecPrefill (its speculator KV kept), its conversation rebuilt densely: (the reply, the
    KVState a second turn reuses: the dense conversation with turn 1's speculator KV)."""
    turn1 = GenerationInfo()
    reply = run(t.model, ids1, method, turn1, max_tokens=5)
    rebuilt = GenerationInfo()
    run(t.model, ids1 + reply + [1], PrefillMethod(), rebuilt, max_tokens=1)
    return reply, KVState(rebuilt.kv.cache, len(ids1) + len(reply), speculator=turn1.kv.speculator)


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_the_composition_walks_its_speculator_by_h2o_from_its_cached_kv(tiny, arch):
    """The composition from a reused prefix: the speculator prefills only its new tokens, by H2O walked
    from its own dense KV of the conversation (the reference speculator's rows past that KV: the
    reference H2O walk from a prefix), the selection over the main model's new part; the main model
    decodes as the oracle's dense forward over prefix + kept tokens. Only the speculator KV's dense
    part is kept (its H2O slots are approximate)."""
    t = tiny(arch)
    spec = replace(METHOD, speculator="self:2")
    composed = replace(spec, specprefill=replace(CONFIG, speculator_prefill=SPECULATOR_H2O))
    ids1 = prompt(70, t.args.vocab_size, seed=11)
    reply, dense = dense_turn1(t, ids1, spec)
    ids2, held, cached = ids1 + reply + prompt(60, t.args.vocab_size, seed=12), len(ids1) + len(reply), len(ids1)
    read: list[tuple[str, int]] = []
    info = GenerationInfo()
    tokens = list(
        t.model.generate_step(
            ids2,
            max_tokens=4,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=composed,
            info=info,
            reuse=dense,
            progress=lambda done, total: read.append((info.step.stage, total)),
        )
    )
    assert [r for r in read if r[0] == "speculator"][-1][1] == len(ids2) - cached  # only its new tokens
    window = min(CONFIG.query_window, len(ids2) - held)
    queries, keys, _ = t.ref.speculator_pass(ids2, 2, 3, window=window, h2o_config=SPECULATOR_H2O, prefix=cached)
    _, selection = speculative_selection(
        queries, keys, composed.specprefill, t.ref.scale, REFERENCE, n_window=window, reused=held
    )
    kept = info.kept_positions[held:]
    assert kept == selection.kept.tolist() and info.method == composed.label
    assert tokens == oracle_greedy(t, ids2, held, kept, len(tokens))
    assert info.kv.prefix == held and info.kv.speculator.slots == cached  # the speculator's dense part only
    _, dense_keys, _ = t.ref.speculator_pass(ids2, 2, 3, window=window)
    assert np.abs(dense_keys[1, :, cached:] - keys[1, :, cached:]).max() > 1e-3 * np.abs(keys).max()  # H2O ran


def test_the_composed_speculator_from_its_cache_equals_the_reference_walk(tiny):
    """run_speculator over an H2O speculator from its cached dense KV: its captured queries and prompt
    keys equal the reference's (H2O from the prefix), not the dense pass's nor the whole-prompt walk's."""
    from specfill.core.methods.specprefill import run_speculator

    t = tiny("qwen2")
    ids = prompt(80, t.args.vocab_size, seed=21)
    model, step = t.model.speculator_model("self:2")
    ops, np_ids = t.model.ops, np.array(ids)
    first = run_speculator(ops, model, np_ids[:30], lookahead=0, stop_ids=frozenset(), step_size=step)
    got = run_speculator(
        ops, model, np_ids, lookahead=3, stop_ids=frozenset(), step_size=step, query_window=3, h2o=SPECULATOR_H2O,
        cache=first.cache, cached=30,
    )  # fmt: skip
    queries, keys, fed = t.ref.speculator_pass(ids, 2, 3, window=3, h2o_config=SPECULATOR_H2O, prefix=30)
    assert got.lookahead == fed
    assert_logits_close(t, got.queries, queries, "captured queries")
    assert_logits_close(t, got.keys, keys, "prompt keys")
    for other in (
        t.ref.speculator_pass(ids, 2, 3, window=3)[1],
        t.ref.speculator_pass(ids, 2, 3, window=3, h2o_config=SPECULATOR_H2O)[1],
    ):
        assert np.abs(other[1] - keys[1]).max() > 100 * tolerance(keys)


@pytest.mark.parametrize("bug", ["prefix-selected", "lookahead-kv-kept"])
def test_a_planted_reuse_bug_fails_the_reference_check(tiny, monkeypatch, bug):
    """The checks above are not vacuous: a selection over the whole prompt (the prefix too), or a
    speculator cache not cut back to the conversation (turn 1's look-ahead KV left before turn 2's
    new tokens), gives another kept set or other tokens than the reference's."""
    from specfill.core.methods import specprefill as method_module
    from specfill.core.reference import specprefill as reference_module

    t = tiny("llama")
    ids1 = prompt(70, t.args.vocab_size, seed=11)
    turn1 = GenerationInfo()
    reply = run(t.model, ids1, METHOD, turn1, max_tokens=5)
    conversation = ids1 + reply
    rebuilt = GenerationInfo()
    run(t.model, conversation + [1], PrefillMethod(), rebuilt, max_tokens=1)
    dense = KVState(rebuilt.kv.cache, len(conversation), speculator=turn1.kv.speculator)
    ids2 = conversation + prompt(60, t.args.vocab_size, seed=12)
    if bug == "prefix-selected":
        whole = reference_module.select_tokens
        monkeypatch.setattr(
            reference_module, "select_new_tokens", lambda imp, reused, config, select=None: whole(imp, config)
        )
    else:
        original = method_module.run_speculator

        def stale(*args, cache=None, cached=0, **kwargs):
            if cache is not None:
                cached = cache.filled  # the look-ahead's slots stay
                kwargs["query_window"] = 1
            return original(*args, cache=cache, cached=cached, **kwargs)

        monkeypatch.setattr(method_module, "run_speculator", stale)
    turn2 = GenerationInfo()
    tokens = run(t.model, ids2, METHOD, turn2, reuse=dense)
    kept = turn2.kept_positions[len(conversation) :]
    assert kept != expected_kept(t, ids2, len(conversation)) or tokens != oracle_greedy(
        t, ids2, len(conversation), kept, len(tokens)
    )


def test_protected_spans_are_kept_from_a_reused_prefix_as_the_reference_keeps_them(tiny):
    t = tiny("qwen2")
    ids, reused = prompt(100, t.args.vocab_size, seed=6), 30
    first = GenerationInfo()
    run(t.model, ids[:reused], PrefillMethod(), first, max_tokens=1)
    config = replace(CONFIG, protected=((0, 10), (50, 58)))  # the first in the dense prefix
    info = GenerationInfo()
    tokens = run(t.model, ids, replace(METHOD, specprefill=config), info, reuse=first.kv)
    kept = info.kept_positions[reused:]
    queries, keys, _ = reference_speculator(t.ref, ids, 1, CONFIG.lookahead, window=4)
    want = speculative_selection(queries, keys, config, t.ref.scale, REFERENCE, n_window=4, reused=reused)[
        1
    ].kept.tolist()
    assert kept == want and set(range(50, 58)) <= set(kept)
    assert tokens == oracle_greedy(t, ids, reused, kept, len(tokens))
