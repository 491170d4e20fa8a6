"""The MLX-ops twins with a layer's attention terms (sinks, logit soft-cap) against the NumPy
reference, and the dispatchers' fallback: a Metal kernel takes no terms, so a layer with them
runs the twin even where Metal would run, said once per kernel."""

from __future__ import annotations

import warnings

import mlx.core as mx
import numpy as np
import pytest

import specfill.backends.mlx.kernels.dispatch as dispatch
import specfill.backends.mlx.kernels.inter as inter
import specfill.backends.mlx.kernels.intra as intra
import specfill.backends.mlx.kernels.scoring as scoring
from specfill.backends.mlx.kernels import add_sinks, attention_scores, empty_state, inter_attention, intra_attention
from specfill.core import self_check
from specfill.core.errors import SpecfillWarning
from specfill.core.reference import REFERENCE
from specfill.core.stages import AttentionState, AttentionTerms, KeyWindow

SCALE = 0.25
TERMS = [(True, None), (False, 1.5), (True, 3.0)]


def case(seed, n_heads=6, n_kv=2, n_tokens=29):
    rng = np.random.default_rng(seed)
    host = [
        x.astype(np.float32)
        for x in (
            rng.normal(size=(n_heads, n_tokens, 16)) * 2,
            rng.normal(size=(n_kv, n_tokens, 16)),
            rng.normal(size=(n_kv, n_tokens, 16)),
            rng.normal(size=n_heads) * 2,
        )
    ]
    return [mx.array(h) for h in host], [h.astype(np.float64) for h in host]


def close(got, want, tol=2e-5):
    np.testing.assert_allclose(np.array(got).astype(np.float64), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("sinks,softcap", TERMS)
@pytest.mark.parametrize("window", [None, 5])
def test_intra_and_inter_twins_take_the_terms(sinks, softcap, window):
    (q, k, v, s), (hq, hk, hv, hs) = case(1)
    terms, ref_terms = AttentionTerms(s if sinks else None, softcap), AttentionTerms(hs if sinks else None, softcap)
    got = intra_attention(q, k, v, 8, SCALE, use_kernel=False, window=window, terms=terms)
    want = REFERENCE.intra_attention(hq, hk, hv, 8, SCALE, window, ref_terms)
    close(got.state.o, want.state.o)
    close(got.colsum, want.colsum)
    memory = np.sort(np.random.default_rng(2).choice(20, size=(2, 6)), axis=1)
    got = inter_attention(
        q[:, 21:],
        k[:, :6],
        v[:, :6],
        SCALE,
        use_kernel=False,
        window=None if window is None else KeyWindow(window, 21, mx.array(memory)),
        terms=terms,
    )
    want = REFERENCE.inter_attention(
        hq[:, 21:], hk[:, :6], hv[:, :6], SCALE, None if window is None else KeyWindow(window, 21, memory), ref_terms
    )
    close(got.state.o, want.state.o)
    close(got.colsum, want.colsum)


@pytest.mark.parametrize("sinks,softcap", TERMS)
@pytest.mark.parametrize("window", [None, 2])
def test_scoring_twin_takes_the_terms(sinks, softcap, window):
    rng = np.random.default_rng(3)
    queries, keys, sink_values = (
        x.astype(np.float32)
        for x in (rng.normal(size=(1, 4, 6, 16)) * 2, rng.normal(size=(1, 2, 30, 16)), rng.normal(size=6))
    )
    got = attention_scores(
        mx.array(queries),
        mx.array(keys),
        SCALE,
        use_kernel=False,
        window=window,
        terms=AttentionTerms(mx.array(sink_values) if sinks else None, softcap),
    )
    want = REFERENCE.attention_scores(
        queries.astype(np.float64),
        keys.astype(np.float64),
        SCALE,
        window,
        AttentionTerms(sink_values.astype(np.float64) if sinks else None, softcap),
    )
    close(got, want)
    assert np.isfinite(np.array(got)).all()


def test_add_sinks_on_empty_rows_and_extreme_sinks():
    sinks = np.array([-100.0, 0.0, 3.0, 100.0])
    for state in (
        empty_state(4, 5, 16, mx.float32),
        AttentionState(mx.full((4, 5), 80.0), mx.full((4, 5), 2.0), mx.ones((4, 5, 16))),
    ):
        got = add_sinks(state, mx.array(sinks.astype(np.float32)))
        host = AttentionState(*(np.array(x).astype(np.float64) for x in (state.m, state.l, state.o)))
        want = REFERENCE.add_sinks(host, sinks)
        assert all(np.isfinite(np.array(x)).all() for x in (got.m, got.l, got.o))
        close(got.o, want.o, 1e-6)


def test_a_kernel_falls_back_to_its_twin_for_terms_said_once(monkeypatch):
    """Where the dispatcher would run the Metal kernel, a layer with terms runs the twin (the kernel
    is never called) and one SpecfillWarning per kernel says so."""
    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    for module, name in (
        (intra, "intra_attention_kernel"),
        (inter, "inter_attention_kernel"),
        (scoring, "attention_scores_kernel"),
    ):
        monkeypatch.setattr(module, name, lambda *a, _name=name: pytest.fail(f"{_name} ran with terms"))
    monkeypatch.setattr(self_check, "_TERM_FALLBACKS", set())
    (q, k, v, s), _ = case(4)
    terms = AttentionTerms(s, 2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            mx.eval(intra_attention(q, k, v, 8, SCALE, use_kernel=True, terms=terms).colsum)
            mx.eval(inter_attention(q, k, v, SCALE, use_kernel=True, terms=terms).colsum)
            mx.eval(
                attention_scores(mx.zeros((1, 2, 6, 16)), mx.ones((1, 2, 9, 16)), SCALE, use_kernel=True, terms=terms)
            )
    said = [str(w.message) for w in caught if issubclass(w.category, SpecfillWarning)]
    assert len(said) == 3 and all("takes no attention sinks or logit soft-cap" in line for line in said), said
    assert ("mlx", "speculative-prefill scoring") in self_check.term_fallbacks()


@pytest.mark.parametrize("block", [256, 3])
def test_terms_attention_of_a_model_step_equals_the_explicit_softmax(block, monkeypatch):
    """A plain step of a layer with terms (positions, not slots: SpecPrefill's kept tokens), in
    blocks of query rows or not, against softmax([capped logits, sink]) over the visible keys."""
    import specfill.backends.mlx.model as model

    monkeypatch.setattr(model, "TERMS_QUERY_BLOCK", block)
    rng = np.random.default_rng(5)
    q, k, v, sinks = (
        x.astype(np.float32)
        for x in (
            rng.normal(size=(1, 4, 7, 16)),
            rng.normal(size=(1, 2, 12, 16)),
            rng.normal(size=(1, 2, 12, 16)),
            rng.normal(size=4),
        )
    )
    key_positions = np.array([0, 1, 2, 5, 6, 9, 10, 11, 14, 15, 16, 20])
    q_positions = key_positions[5:]
    got = model.terms_attention(
        mx.array(q),
        mx.array(k),
        mx.array(v),
        SCALE,
        AttentionTerms(mx.array(sinks), 2.0),
        q_positions,
        key_positions,
        window=8,
    )
    logits = 2.0 * np.tanh(np.einsum("htd,hsd->hts", q[0], np.repeat(k[0], 2, axis=0)).astype(np.float64) * SCALE / 2.0)
    distance = q_positions[:, None] - key_positions[None, :]
    logits = np.where((distance >= 0) & (distance < 8), logits, -np.inf)
    full = np.concatenate([logits, np.broadcast_to(sinks[:, None, None], (4, 7, 1))], axis=-1)
    weights = np.exp(full - full.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True))[..., :-1] @ np.repeat(v[0], 2, axis=0)
    close(got[0], want, 1e-5)
