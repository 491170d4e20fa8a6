"""The torch twins with a layer's attention terms (sinks, logit soft-cap) against the NumPy
reference, and the dispatchers' fallback: a Triton kernel takes no terms, so a layer with them
runs the twin even where the kernel would run, said once per kernel."""

import warnings

import numpy as np
import pytest
import torch

import specfill.backends.torch_cuda.kernels.dispatch as dispatch
from specfill.backends.torch_cuda.kernels import (
    add_sinks,
    attention_scores,
    empty_state,
    inter_attention,
    intra_attention,
)
from specfill.core import self_check
from specfill.core.errors import SpecfillWarning
from specfill.core.reference import REFERENCE
from specfill.core.reference.attention import AttentionState
from specfill.core.stages import AttentionTerms, KeyWindow

torch.set_num_threads(1)
SCALE = 0.25


def case(seed, n_heads=6, n_kv=2, n_tokens=29, logit_scale=2.0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n_heads, n_tokens, 16)) * logit_scale,
        rng.normal(size=(n_kv, n_tokens, 16)),
        rng.normal(size=(n_kv, n_tokens, 16)),
        rng.normal(size=n_heads) * 2,
    )


def t(x, dtype=torch.float64):
    return torch.as_tensor(np.asarray(x)).to(dtype)


TERMS = [(True, None), (False, 1.5), (True, 3.0)]


@pytest.mark.parametrize("sinks,softcap", TERMS)
@pytest.mark.parametrize("window", [None, 5])
def test_intra_and_inter_twins_take_the_terms(sinks, softcap, window):
    q, k, v, sink_values = case(1)
    ref_terms = AttentionTerms(sink_values if sinks else None, softcap)
    terms = AttentionTerms(t(sink_values) if sinks else None, softcap)
    got = intra_attention(t(q), t(k), t(v), 8, SCALE, use_kernel=False, window=window, terms=terms)
    want = REFERENCE.intra_attention(q, k, v, 8, SCALE, window, ref_terms)
    np.testing.assert_allclose(got.state.o.numpy(), want.state.o, atol=1e-12)
    np.testing.assert_allclose(got.colsum.numpy(), want.colsum, atol=1e-12)
    memory = np.sort(np.random.default_rng(2).choice(20, size=(2, 6)), axis=1)
    key_window = None if window is None else KeyWindow(window, 21, t(memory, torch.int64))
    got = inter_attention(
        t(q[:, 21:]), t(k[:, :6]), t(v[:, :6]), SCALE, use_kernel=False, window=key_window, terms=terms
    )
    want = REFERENCE.inter_attention(
        q[:, 21:], k[:, :6], v[:, :6], SCALE, None if window is None else KeyWindow(window, 21, memory), ref_terms
    )
    np.testing.assert_allclose(got.state.o.numpy(), want.state.o, atol=1e-12)
    np.testing.assert_allclose(got.colsum.numpy(), want.colsum, atol=1e-12)
    assert torch.isfinite(got.colsum).all() and torch.isfinite(got.state.l).all()


@pytest.mark.parametrize("sinks,softcap", TERMS)
@pytest.mark.parametrize("window", [None, 2])
def test_scoring_twin_takes_the_terms(sinks, softcap, window):
    rng = np.random.default_rng(3)
    queries, keys, sink_values = rng.normal(size=(1, 4, 6, 16)) * 2, rng.normal(size=(1, 2, 30, 16)), rng.normal(size=6)
    got = attention_scores(
        t(queries),
        t(keys),
        SCALE,
        use_kernel=False,
        window=window,
        terms=AttentionTerms(t(sink_values) if sinks else None, softcap),
    )
    want = REFERENCE.attention_scores(
        queries, keys, SCALE, window, AttentionTerms(sink_values if sinks else None, softcap)
    )
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    assert torch.isfinite(got).all()


def test_add_sinks_on_empty_rows_and_extreme_sinks():
    sinks = np.array([-100.0, 0.0, 3.0, 100.0])
    for state in (
        empty_state(4, 5, 16, torch.float32, torch.device("cpu")),
        AttentionState(torch.full((4, 5), 80.0), torch.full((4, 5), 2.0), torch.ones(4, 5, 16)),
    ):
        got = add_sinks(state, t(sinks, torch.float32))
        want = REFERENCE.add_sinks(AttentionState(*(x.double().numpy() for x in (state.m, state.l, state.o))), sinks)
        assert all(torch.isfinite(x).all() for x in (got.m, got.l, got.o))
        np.testing.assert_allclose(got.o.numpy(), want.o, atol=1e-6)
        np.testing.assert_allclose(got.l.numpy(), want.l, rtol=1e-6)


def test_a_kernel_falls_back_to_its_twin_for_terms_said_once(monkeypatch):
    """Where the dispatcher would launch the Triton kernel, a layer with terms runs the twin (the
    kernel is never fetched) and one SpecfillWarning per kernel says so."""
    monkeypatch.setattr(dispatch, "kernel_unavailable_reason", lambda device, dtype: None)
    monkeypatch.setattr(dispatch, "triton_kernel", lambda name: pytest.fail(f"kernel {name} launched with terms"))
    monkeypatch.setattr(self_check, "_TERM_FALLBACKS", set())
    q, k, v, sinks = case(4)
    terms = AttentionTerms(t(sinks, torch.float32), 2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            intra_attention(
                t(q, torch.float32), t(k, torch.float32), t(v, torch.float32), 8, SCALE, use_kernel=True, terms=terms
            )
            inter_attention(
                t(q, torch.float32), t(k, torch.float32), t(v, torch.float32), SCALE, use_kernel=True, terms=terms
            )
            attention_scores(torch.randn(1, 2, 6, 16), torch.randn(1, 2, 9, 16), SCALE, use_kernel=True, terms=terms)
    said = [str(w.message) for w in caught if issubclass(w.category, SpecfillWarning)]
    assert len(said) == 3 and all("takes no attention sinks or logit soft-cap" in line for line in said), said
    assert ("cuda", "phase-1 intra attention") in self_check.term_fallbacks()


@pytest.mark.parametrize("block", [256, 3])
def test_terms_attention_of_a_model_step_equals_the_explicit_softmax(block, monkeypatch):
    """A plain step of a layer with terms (positions, not slots: SpecPrefill's kept tokens), in
    blocks of query rows or not, against softmax([capped logits, sink]) over the visible keys."""
    import specfill.backends.torch_cuda.attention as attention

    monkeypatch.setattr(attention, "TERMS_QUERY_BLOCK", block)
    rng = np.random.default_rng(5)
    q, k, v, sinks = (
        rng.normal(size=(1, 4, 7, 16)),
        rng.normal(size=(1, 2, 12, 16)),
        rng.normal(size=(1, 2, 12, 16)),
        rng.normal(size=4),
    )
    key_positions = np.array([0, 1, 2, 5, 6, 9, 10, 11, 14, 15, 16, 20])
    q_positions = key_positions[5:]
    got = attention.terms_attention(
        t(q, torch.float32),
        t(k, torch.float32),
        t(v, torch.float32),
        SCALE,
        AttentionTerms(t(sinks, torch.float32), 2.0),
        torch.as_tensor(q_positions),
        torch.as_tensor(key_positions),
        window=8,
    )
    logits = 2.0 * np.tanh(np.einsum("htd,hsd->hts", q[0], np.repeat(k[0], 2, axis=0)) * SCALE / 2.0)
    distance = q_positions[:, None] - key_positions[None, :]
    logits = np.where((distance >= 0) & (distance < 8), logits, -np.inf)
    full = np.concatenate([logits, np.broadcast_to(sinks[:, None, None], (4, 7, 1))], axis=-1)
    weights = np.exp(full - full.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True))[..., :-1] @ np.repeat(v[0], 2, axis=0)
    np.testing.assert_allclose(got[0].double().numpy(), want, atol=1e-5)
