"""A layer's attention terms (core/stages.AttentionTerms: per-head sinks, a logit soft-cap) in the
NumPy reference: the H2O walk against the naive oracle, the sink folded in once, SpecPrefill's
scores against gpt_oss's and gemma2's own formulations, finite results at the edges, and the
terms-free path untouched."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.config import H2OConfig
from specfill.core.reference import REFERENCE, oracle
from specfill.core.reference.attention import add_sinks, empty_state
from specfill.core.reference.h2o import causal_attention
from specfill.core.stages import AttentionTerms, active_terms

SCALE = 0.25


def tensors(seed: int, n_heads: int = 4, n_kv: int = 2, n_tokens: int = 45, logit_scale: float = 2.0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n_heads, n_tokens, 16)) * logit_scale,
        rng.normal(size=(n_kv, n_tokens, 16)),
        rng.normal(size=(n_kv, n_tokens, 16)),
        rng.normal(size=n_heads) * 2.0,
    )


@pytest.mark.parametrize("sinks,softcap", [(True, None), (False, 1.5), (True, 2.0)])
@pytest.mark.parametrize("window,tail,n_heads", [(None, 0, 4), (11, 0, 6), (None, 10, 2), (11, 13, 8)])
def test_the_walk_with_terms_equals_the_oracle(sinks, softcap, window, tail, n_heads):
    q, k, v, sink_values = tensors(3, n_heads=n_heads)
    terms = AttentionTerms(sink_values if sinks else None, softcap)
    config = H2OConfig(8, 16, 2, 3, dense_tail=tail)
    got = REFERENCE.attention_layer(q, k, v, config, SCALE, window, terms)
    want_out, want_sets, want_scores = oracle.oracle_h2o_layer(
        q, k, v, 8, 2, 3, SCALE, tail, window, sinks=terms.sinks, softcap=softcap
    )
    assert [m.indices.tolist() for m in got.memory_sets] == want_sets
    np.testing.assert_allclose(got.output, want_out, atol=1e-12)
    np.testing.assert_allclose(got.scores, want_scores, atol=1e-12)
    plain = REFERENCE.attention_layer(q, k, v, config, SCALE, window)
    assert np.abs(plain.output - got.output).max() > 1e-3, "the terms changed the outputs"


def test_the_sink_is_added_once_to_a_query_with_both_phases():
    """Folding the sink into phase 1's and phase 2's states before the merge counts it twice; the
    oracle (one softmax over K(i) plus the sink) agrees with folding it into the merged state."""
    q, k, v, sinks = tensors(4)
    terms = AttentionTerms(sinks)
    intra = REFERENCE.intra_attention(q[:, 8:16], k[:, 8:16], v[:, 8:16], 8, SCALE, None, terms).state
    inter = REFERENCE.inter_attention(q[:, 8:16], k[:, :8], v[:, :8], SCALE, None, terms).state
    once = add_sinks(REFERENCE.merge_states(inter, intra), sinks)
    twice = REFERENCE.merge_states(add_sinks(inter, sinks), add_sinks(intra, sinks))
    logits = np.einsum("htd,hjd->htj", q[:, 8:16], np.repeat(k, 2, axis=0)[:, :16]) * SCALE
    causal = np.arange(16)[None, :] <= np.arange(8, 16)[:, None]
    full = np.concatenate([np.where(causal, logits, -np.inf), np.broadcast_to(sinks[:, None, None], (4, 8, 1))], -1)
    weights = np.exp(full - full.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    want = weights[..., :-1] @ np.repeat(v, 2, axis=0)[:, :16]
    np.testing.assert_allclose(once.o, want, atol=1e-12)
    assert np.abs(twice.o - want).max() > 1e-4


def test_column_sums_take_the_sink_in_their_denominator():
    q, k, v, sinks = tensors(5, n_tokens=8)
    got = REFERENCE.intra_attention(q, k, v, 8, SCALE, None, AttentionTerms(sinks))
    plain = REFERENCE.intra_attention(q, k, v, 8, SCALE)
    np.testing.assert_array_equal(got.state.o, plain.state.o)  # states stay sink-free
    share = 1.0 - got.colsum.sum(axis=1) / plain.colsum.sum(axis=1)  # each query's mass moved to its sink
    assert np.all(share > 0) and np.all(share < 1)


def test_fully_masked_rows_and_extreme_logits_stay_finite():
    empty = empty_state(4, 3, 16, np.float32)
    folded = add_sinks(empty, np.array([-100.0, 0.0, 5.0, 100.0], np.float32))
    assert np.isfinite(folded.m).all() and np.isfinite(folded.l).all() and not folded.o.any()
    q, k, v, _ = tensors(6, n_tokens=30, logit_scale=40.0)
    terms = AttentionTerms(np.array([-100.0, 100.0, 0.0, 50.0]), 30.0)
    for dtype in (np.float32, np.float64):
        got = REFERENCE.attention_layer(*(x.astype(dtype) for x in (q, k, v)), H2OConfig(8, 16, 2, 3), SCALE, 3, terms)
        assert np.isfinite(got.output).all() and np.isfinite(got.scores).all()
    queries, keys = (
        np.random.default_rng(7).normal(size=(2, 1, 3, 4, 16)) * 40,
        np.random.default_rng(8).normal(size=(1, 2, 20, 16)),
    )
    probs = REFERENCE.attention_scores(queries[0], keys, SCALE, 2, terms)  # the last queries see no key
    assert np.isfinite(probs).all() and not probs[2].any()


def test_scores_match_gpt_oss_and_gemma2_formulations():
    """gpt_oss: the sink is a column of logits softmaxed with the keys and dropped; gemma2: scaled,
    then cap * tanh(x / cap), then the mask."""
    rng = np.random.default_rng(9)
    queries, keys, sinks = rng.normal(size=(1, 3, 4, 16)) * 2, rng.normal(size=(1, 2, 25, 16)), rng.normal(size=4)
    logits = np.einsum("lqhd,lhpd->qlhp", queries, np.repeat(keys, 2, axis=1)) * SCALE
    column = np.broadcast_to(sinks[None, None, :, None], logits.shape[:-1] + (1,))
    combined = np.concatenate([logits, column], axis=-1)
    gpt_oss = np.exp(combined - combined.max(-1, keepdims=True))
    gpt_oss = (gpt_oss / gpt_oss.sum(-1, keepdims=True))[..., :-1]
    np.testing.assert_allclose(
        REFERENCE.attention_scores(queries, keys, SCALE, None, AttentionTerms(sinks)), gpt_oss, atol=1e-14
    )
    capped = 1.5 * np.tanh(logits / 1.5)
    gemma2 = np.exp(capped - capped.max(-1, keepdims=True))
    np.testing.assert_allclose(
        REFERENCE.attention_scores(queries, keys, SCALE, None, AttentionTerms(None, 1.5)),
        gemma2 / gemma2.sum(-1, keepdims=True),
        atol=1e-14,
    )


def test_empty_terms_take_the_plain_path_bit_for_bit():
    q, k, v, _ = tensors(10)
    assert active_terms(AttentionTerms()) is None and active_terms(None) is None
    config = H2OConfig(8, 16, 2, 3, dense_tail=5)
    got = REFERENCE.attention_layer(q, k, v, config, SCALE, 9, AttentionTerms())
    plain = REFERENCE.attention_layer(q, k, v, config, SCALE, 9)
    np.testing.assert_array_equal(got.output, plain.output)
    np.testing.assert_array_equal(got.scores, plain.scores)
    np.testing.assert_array_equal(causal_attention(q, k, v, SCALE, None, None).o, causal_attention(q, k, v, SCALE).o)
    with pytest.raises(ValueError, match="positive"):
        AttentionTerms(None, 0.0)


def test_h2o_disabled_with_terms_is_causal_attention_with_them():
    q, k, v, sinks = tensors(11, n_tokens=20)
    terms = AttentionTerms(sinks, 3.0)
    got = REFERENCE.attention_layer(q, k, v, H2OConfig(8, 16, 0, 0), SCALE, None, terms)
    want, _ = oracle.replay_h2o_layer(q, k, v, 20, [], SCALE, sinks=sinks, softcap=3.0)
    np.testing.assert_allclose(got.output, want, atol=1e-12)
    assert not got.scores.any()
