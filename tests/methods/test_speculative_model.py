"""Speculative prefill inside each backend's model: the speculator pass, the selection, the sparse
main prefill at original positions and decoding from position P, against NumPy oracles."""

from __future__ import annotations

import numpy as np
import pytest

from specfill import load
from specfill.core.config import SpecPrefillConfig
from specfill.core.errors import ConfigError, PromptTooLongError, TokenizerMismatchError
from specfill.core.methods.prefill import prefill
from specfill.core.methods.specprefill import run_speculator, speculative_prefill
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.request import fit_lookahead
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import (
    MODULES,
    assert_logits_close,
    cache_fill,
    greedy,
    prompt,
    reference_speculator,
    tolerance,
    variant,
)

ARCHS = ("llama", "qwen2", "qwen3")


def spec(keep: float, speculator: object = "self:1", lookahead: int = 4, chunk: int = 8) -> PrefillMethod:
    config = SpecPrefillConfig(keep_ratio=keep, lookahead=lookahead, select_chunk=chunk, pool_kernel=3)
    return PrefillMethod("specprefill", specprefill=config, speculator=speculator)


def sparse(t, ids: list[int], method: PrefillMethod, extra: int = 8):
    model = t.model
    speculator, step = model.speculator_model(method.speculator)
    return speculative_prefill(
        model.ops,
        model.model,
        np.array(ids),
        speculator,
        method.specprefill,
        stop_ids=frozenset(),
        extra_slots=extra,
        step_size=model.prefill_step_size,
        speculator_step_size=step,
    )


def speculate(
    t, ids: list[int], speculator: object = "self:2", lookahead: int = 4, stop_ids: frozenset[int] = frozenset()
):
    model, step = t.model.speculator_model(speculator)
    return run_speculator(t.model.ops, model, np.array(ids), lookahead=lookahead, stop_ids=stop_ids, step_size=step)


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_everything_is_exactly_full_attention(tiny, arch):
    t = tiny(arch)
    ids = prompt(60, t.args.vocab_size, seed=1)
    method = spec(1.0)
    result = sparse(t, ids, method)
    ops = t.model.ops
    full = prefill(
        ops, t.model.model, ops.tokens(np.array(ids)), 0, ops.new_cache(t.model.model, len(ids)), step_size=2048
    )[-1]
    assert tuple(result.logits.shape) == tuple(full.shape) == (t.args.vocab_size,)
    np.testing.assert_array_equal(ops.to_numpy(result.logits), ops.to_numpy(full))
    info = GenerationInfo()
    assert greedy(t.model, ids, 6, method, info) == greedy(t.model, ids, 6)
    assert info.kept_positions == list(range(60)) and info.kept_tokens == 60


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("speculator_layers", [1, 2])
def test_speculator_captures_queries_keys_and_lookahead(tiny, arch, speculator_layers):
    t = tiny(arch)
    ids = prompt(40, t.args.vocab_size, seed=2)
    got = speculate(t, ids, f"self:{speculator_layers}", lookahead=3)
    queries, keys, fed = reference_speculator(t.ref, ids, speculator_layers, 3)
    assert got.lookahead == fed and len(fed) == 3
    assert tuple(got.queries.shape) == (speculator_layers, 4, t.args.num_attention_heads, t.args.head_dim)
    assert_logits_close(t, got.queries, queries, "captured queries")
    assert_logits_close(t, got.keys, keys, "prompt keys")


def test_lookahead_stops_at_a_stop_id_without_feeding_it(tiny):
    t = tiny("llama")
    ids = prompt(30, t.args.vocab_size, seed=5)
    free = speculate(t, ids)
    first, second = free.lookahead[:2]
    assert first != second, "pick a prompt whose first two look-ahead tokens differ"
    stopped = speculate(t, ids, stop_ids=frozenset({second}))
    assert stopped.lookahead == [first] and stopped.queries.shape[1] == 2
    to_numpy = t.model.ops.to_numpy
    np.testing.assert_array_equal(to_numpy(stopped.queries), to_numpy(free.queries[:, :2]))
    assert speculate(t, ids, stop_ids=frozenset({first})).queries.shape[1] == 1
    assert speculate(t, ids, lookahead=0).queries.shape[1] == 1


def test_lookahead_stops_at_the_eos_of_a_generation(tiny):
    """Through generate_step: the stop ids given for decoding also end the look-ahead."""
    t = tiny("llama")
    ids = prompt(48, t.args.vocab_size, seed=10)
    eos = t.args.eos_token_ids[0]
    free = speculate(t, ids, "self:1", lookahead=4)
    assert free.lookahead[2] == eos and eos not in free.lookahead[:2], "pick a prompt whose look-ahead hits eos"
    method = spec(0.3, "self:1", lookahead=4, chunk=2)
    with_eos, without = GenerationInfo(), GenerationInfo()
    greedy(t.model, ids, 1, method, with_eos, stop_ids=frozenset({eos}))
    greedy(t.model, ids, 1, method, without)
    queries, keys, fed = reference_speculator(t.ref, ids, 1, 4, stop_ids=frozenset({eos}))
    assert fed == free.lookahead[:2]
    _, selection = speculative_selection(queries, keys, method.specprefill, t.ref.scale, REFERENCE)
    assert with_eos.kept_positions == selection.kept.tolist()
    assert with_eos.kept_positions != without.kept_positions, "pick a prompt where the look-ahead matters"


@pytest.mark.parametrize("arch", ARCHS)
def test_selection_equals_the_reference_scoring_of_the_reference_speculator(tiny, arch):
    t = tiny(arch)
    ids = prompt(90, t.args.vocab_size, seed=6)
    method = spec(0.3, "self:1", lookahead=3)
    info = GenerationInfo()
    greedy(t.model, ids, 1, method, info)
    queries, keys, _ = reference_speculator(t.ref, ids, 1, 3)
    _, selection = speculative_selection(queries, keys, method.specprefill, t.ref.scale, REFERENCE)
    assert info.kept_positions == selection.kept.tolist()
    assert 8 < info.kept_tokens < 90 and info.kept_positions[-1] == 89  # the last token is forced in


@pytest.mark.parametrize("arch", ARCHS)
def test_query_window_captures_and_scores_as_the_reference(tiny, arch):
    """query_window W: the prompt's last W queries (across prefill steps of 7 tokens) then the
    look-ahead's, each window query scoring only the keys at or before its position, select what
    the reference's scoring of the reference speculator selects; W = 1 is the paper's pass."""
    t = tiny(arch)
    ids = prompt(90, t.args.vocab_size, seed=6)
    model, _ = t.model.speculator_model("self:1")
    ops = t.model.ops
    run = run_speculator(ops, model, np.array(ids), lookahead=3, stop_ids=frozenset(), step_size=7, query_window=10)
    queries, keys, fed = reference_speculator(t.ref, ids, 1, 3, window=10)
    assert run.n_window == 10 and run.lookahead == fed
    got = ops.to_numpy(run.queries)
    assert got.shape == queries.shape and float(np.abs(got - queries).max()) <= tolerance(queries)
    config = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3, query_window=10)
    info = GenerationInfo()
    greedy(t.model, ids, 1, PrefillMethod("specprefill", specprefill=config, speculator="self:1"), info)
    _, selection = speculative_selection(queries, keys, config, t.ref.scale, REFERENCE, n_window=10)
    assert info.kept_positions == selection.kept.tolist()
    _, paper = speculative_selection(queries[:, 9:], keys, config, t.ref.scale, REFERENCE)
    assert paper.kept.tolist() != selection.kept.tolist(), "pick a prompt where the window changes the selection"
    one = run_speculator(ops, model, np.array(ids), lookahead=3, stop_ids=frozenset(), step_size=7)
    np.testing.assert_array_equal(ops.to_numpy(one.queries), ops.to_numpy(run.queries)[:, 9:])


@pytest.mark.parametrize("arch", ARCHS)
def test_first_decoded_token_sits_at_the_prompt_length(tiny, arch):
    t = tiny(arch)
    ids = prompt(80, t.args.vocab_size, seed=7)
    result = sparse(t, ids, spec(0.25))
    kept = np.asarray(result.selection.kept).tolist()
    n_kept, n_prompt = len(kept), len(ids)
    assert n_kept < n_prompt and result.next_position == n_prompt
    assert cache_fill(result.cache) == [n_kept, n_kept]
    kept_ids = [ids[i] for i in kept]
    assert_logits_close(t, result.logits, t.ref.forward(kept_ids, kept)[-1], "sparse prefill, last kept token")
    ops = t.model.ops
    first = int(np.argmax(ops.to_numpy(result.logits)))
    decoded = ops.forward(t.model.model, ops.tokens(np.array([first])), result.next_position, result.cache, None, 0)[-1]
    at_prompt_length = t.ref.forward(kept_ids + [first], kept + [n_prompt])[-1]
    at_kept_count = t.ref.forward(kept_ids + [first], kept + [n_kept])[-1]
    assert_logits_close(t, decoded, at_prompt_length, "first decode step at position P")
    # the check can tell P from K: decoding at slot index K would be far outside the tolerance
    assert np.abs(at_kept_count - at_prompt_length).max() > 100 * tolerance(at_prompt_length)


@pytest.mark.parametrize("arch", ARCHS)
def test_decoding_after_sparse_prefill_continues_at_positions_p_and_on(tiny, arch):
    t = tiny(arch)
    ids = prompt(70, t.args.vocab_size, seed=8)
    info = GenerationInfo()
    tokens = greedy(t.model, ids, 8, spec(0.3, "self:2"), info)
    kept = info.kept_positions
    assert info.prompt_tokens == 70 and info.kept_tokens == len(kept) < 70
    context = [ids[i] for i in kept]
    for step, token in enumerate(tokens):
        positions = kept + list(range(len(ids), len(ids) + step))
        assert token == int(t.ref.forward(context + tokens[:step], positions)[-1].argmax()), f"step {step}"
    assert set(info.seconds) == {"speculator", "speculator_pass", "selection", "main_prefill"}
    assert all(s >= 0 for s in info.seconds.values())


def test_self_speculator_is_the_first_layers_of_the_main_model(tiny):
    t = tiny("qwen2")
    one_layer = variant(t, n_layers=1, prefill_step_size=16)
    ids = prompt(75, t.args.vocab_size, seed=9)
    with_self, with_model = GenerationInfo(), GenerationInfo()
    tokens = greedy(t.model, ids, 5, spec(0.2, "self:1"), with_self)
    assert greedy(t.model, ids, 5, spec(0.2, one_layer), with_model) == tokens
    assert with_self.kept_positions == with_model.kept_positions


@pytest.mark.parametrize(
    "speculator,error,match",
    [
        ("self:0", ConfigError, r"1 <= K <= 2"),
        ("self:3", ConfigError, r"1 <= K <= 2"),
        ("self:x", ConfigError, "must be 'self:K'"),
        ("draft.gguf", ConfigError, "must be 'self:K'"),
        (None, ConfigError, "got NoneType"),
        (object(), ConfigError, "loaded on the {backend} backend"),
    ],
)
def test_bad_speculators_are_clear_errors(tiny, speculator, error, match):
    t = tiny("llama")
    with pytest.raises(error, match=match.format(backend=t.backend)):
        t.model.generate_step(
            [5, 6, 7],
            max_tokens=2,
            sampling=None,
            stop_ids=frozenset(),
            method=spec(0.5, speculator),
            info=GenerationInfo(),
        )


def test_a_model_of_the_other_backend_is_not_a_speculator(tiny):
    t = tiny("llama")
    other_backend = {"cuda": "mlx", "mlx": "cuda"}[t.backend]
    pytest.importorskip(MODULES[other_backend], reason=f"needs the {other_backend} backend too")
    other, _ = load(t.path, backend=other_backend, dtype="float32", device="cpu")
    with pytest.raises(
        ConfigError, match=f"loaded on the {t.backend} backend.*got a model on the {other_backend} backend"
    ):
        t.model.generate_step(
            [5, 6, 7], max_tokens=2, sampling=None, stop_ids=frozenset(), method=spec(0.5, other), info=GenerationInfo()
        )


def test_a_speculator_with_another_vocabulary_is_a_tokenizer_mismatch(tiny):
    t = tiny("llama")
    other = variant(t, vocab_size=256)
    with pytest.raises(TokenizerMismatchError, match="256 tokens, the main model's 320"):
        t.model.generate_step(
            [5, 6, 7], max_tokens=2, sampling=None, stop_ids=frozenset(), method=spec(0.5, other), info=GenerationInfo()
        )


def test_a_prompt_longer_than_the_speculator_context_is_an_error(tiny):
    t = tiny("llama")
    short = variant(t, context=32)
    with pytest.raises(PromptTooLongError, match="40 tokens exceeds the speculator's context of 32"):
        t.model.generate_step(
            prompt(40, t.args.vocab_size),
            max_tokens=2,
            sampling=None,
            stop_ids=frozenset(),
            method=spec(0.5, short),
            info=GenerationInfo(),
        )


def test_lookahead_stops_at_the_speculator_context(tiny):
    """fit_lookahead is the one clamp (fit_to_prompt's for a run); the pass runs the steps it fits."""
    t = tiny("qwen3")
    short = variant(t, context=42)
    model, step = short.speculator_model("self:2")
    lookahead = fit_lookahead(4, 40, short.args.max_position_embeddings)
    got = run_speculator(
        short.ops,
        model,
        np.array(prompt(40, t.args.vocab_size)),
        lookahead=lookahead,
        stop_ids=frozenset(),
        step_size=step,
    )
    assert lookahead == 2 and len(got.lookahead) == 2 and got.queries.shape[1] == 3
