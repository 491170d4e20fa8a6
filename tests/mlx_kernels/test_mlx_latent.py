"""The MLX-ops twins with latent attention's shapes (values narrower than keys) against the NumPy
reference (the conformance suite's latent cases run them too), the model step attentions, and the
dispatchers' fallback: the Metal kernels take one head dim, so a latent layer runs the twin even
where Metal would run, said once per kernel."""

from __future__ import annotations

import warnings

import mlx.core as mx
import numpy as np
import pytest

import specfill.backends.mlx.kernels.dispatch as dispatch
import specfill.backends.mlx.kernels.inter as inter
import specfill.backends.mlx.kernels.intra as intra
from specfill.backends.mlx.kernels import inter_attention, intra_attention
from specfill.backends.mlx.model import causal_attention, terms_attention
from specfill.core import self_check
from specfill.core.errors import SpecfillWarning
from specfill.core.reference import REFERENCE
from specfill.core.stages import AttentionTerms

SCALE = 0.2
KEY_DIM, VALUE_DIM = 24, 16


def case(seed, n_heads=6, n_kv=2, n_tokens=29):
    rng = np.random.default_rng(seed)
    host = [
        (rng.normal(size=(n_heads, n_tokens, KEY_DIM)) * 2).astype(np.float32),
        rng.normal(size=(n_kv, n_tokens, KEY_DIM)).astype(np.float32),
        rng.normal(size=(n_kv, n_tokens, VALUE_DIM)).astype(np.float32),
    ]
    return [mx.array(x) for x in host], host


def test_the_twins_take_narrower_values():
    (q, k, v), (hq, hk, hv) = case(1)
    got = intra_attention(q, k, v, 8, SCALE, use_kernel=False)
    want = REFERENCE.intra_attention(hq, hk, hv, 8, SCALE)
    assert got.state.o.shape == (6, 29, VALUE_DIM)
    np.testing.assert_allclose(np.array(got.state.o), want.state.o, atol=1e-5)  # float32 on both sides
    got = inter_attention(q[:, 21:], k[:, :6], v[:, :6], SCALE, use_kernel=False)
    want = REFERENCE.inter_attention(hq[:, 21:], hk[:, :6], hv[:, :6], SCALE)
    np.testing.assert_allclose(np.array(got.state.o), want.state.o, atol=1e-5)
    np.testing.assert_allclose(np.array(got.colsum), want.colsum, atol=1e-5)
    assert inter_attention(q, k[:, :0], v[:, :0], SCALE, use_kernel=False).state.o.shape == (6, 29, VALUE_DIM)


def test_the_step_attentions_take_narrower_values():
    (q, k, v), (hq, hk, hv) = case(2, n_tokens=12)
    logits = np.einsum("htd,hsd->hts", hq, np.repeat(hk, 3, axis=0)).astype(np.float64) * SCALE
    logits = np.where(np.arange(12)[None] <= np.arange(12)[:, None], logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True)) @ np.repeat(hv, 3, axis=0)
    got = causal_attention(q[None], k[None], v[None], SCALE)[0]
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    positions = mx.arange(12)
    got = terms_attention(q[None], k[None], v[None], SCALE, AttentionTerms(None, 1e6), positions, positions)[0]
    np.testing.assert_allclose(np.array(got), want, atol=1e-4)  # a cap of 1e6 binds nowhere: float32 tanh


def test_a_kernel_falls_back_to_its_twin_for_narrower_values_said_once(monkeypatch):
    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    for module, name in ((intra, "intra_attention_kernel"), (inter, "inter_attention_kernel")):
        monkeypatch.setattr(module, name, lambda *a, _name=name: pytest.fail(f"{_name} ran with Dv < D"))
    monkeypatch.setattr(self_check, "_VALUE_DIM_FALLBACKS", set())
    (q, k, v), _ = case(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            mx.eval(intra_attention(q, k, v, 8, SCALE, use_kernel=True).colsum)
            mx.eval(inter_attention(q, k, v, SCALE, use_kernel=True).colsum)
    said = [str(w.message) for w in caught if issubclass(w.category, SpecfillWarning)]
    assert len(said) == 2 and all("narrower (latent attention)" in line for line in said), said
