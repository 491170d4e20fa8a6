"""The torch twins with latent attention's shapes (values of a narrower head dim than keys and
queries) against the NumPy reference, the H2O layer through TorchOps against the oracle, the
plain step attentions, and the dispatchers' fallback: the Triton kernels take one head dim, so a
latent layer runs the twin even where the kernel would run, said once per kernel."""

import warnings

import numpy as np
import pytest
import torch

import specfill.backends.torch_cuda.kernels.dispatch as dispatch
from specfill.backends.torch_cuda.attention import causal_attention, terms_attention, windowed_attention
from specfill.backends.torch_cuda.kernels import inter_attention, intra_attention
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core import self_check
from specfill.core.config import H2OConfig
from specfill.core.errors import SpecfillWarning
from specfill.core.h2o_walk import h2o_attention_layer
from specfill.core.reference import REFERENCE, oracle
from specfill.core.stages import AttentionTerms, KeyWindow

torch.set_num_threads(1)
SCALE = 0.2
KEY_DIM, VALUE_DIM = 24, 16


def case(seed, n_heads=6, n_kv=2, n_tokens=29):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n_heads, n_tokens, KEY_DIM)) * 2,
        rng.normal(size=(n_kv, n_tokens, KEY_DIM)),
        rng.normal(size=(n_kv, n_tokens, VALUE_DIM)),
        rng.normal(size=n_heads) * 2,
    )


def t(x, dtype=torch.float64):
    return torch.as_tensor(np.asarray(x)).to(dtype)


@pytest.mark.parametrize("window,terms", [(None, False), (5, False), (None, True)])
def test_intra_and_inter_twins_take_narrower_values(window, terms):
    q, k, v, sinks = case(1)
    ref_terms = AttentionTerms(sinks, 2.0) if terms else None
    torch_terms = AttentionTerms(t(sinks), 2.0) if terms else None
    got = intra_attention(t(q), t(k), t(v), 8, SCALE, use_kernel=False, window=window, terms=torch_terms)
    want = REFERENCE.intra_attention(q, k, v, 8, SCALE, window, ref_terms)
    assert got.state.o.shape == (6, 29, VALUE_DIM)
    np.testing.assert_allclose(got.state.o.numpy(), want.state.o, atol=1e-12)
    np.testing.assert_allclose(got.colsum.numpy(), want.colsum, atol=1e-12)
    memory = np.sort(np.random.default_rng(2).choice(20, size=(2, 6)), axis=1)
    got = inter_attention(
        t(q[:, 21:]), t(k[:, :6]), t(v[:, :6]), SCALE, use_kernel=False,
        window=None if window is None else KeyWindow(window, 21, t(memory, torch.int64)), terms=torch_terms,
    )  # fmt: skip
    want = REFERENCE.inter_attention(
        q[:, 21:], k[:, :6], v[:, :6], SCALE, None if window is None else KeyWindow(window, 21, memory), ref_terms
    )
    np.testing.assert_allclose(got.state.o.numpy(), want.state.o, atol=1e-12)
    np.testing.assert_allclose(got.colsum.numpy(), want.colsum, atol=1e-12)
    empty = inter_attention(t(q[:, 21:]), t(k[:, :0]), t(v[:, :0]), SCALE, use_kernel=False)
    assert empty.state.o.shape == (6, 8, VALUE_DIM)


@pytest.mark.parametrize("tail", [0, 9])
def test_the_h2o_layer_over_narrower_values_equals_the_oracle(tail):
    q, k, v, _ = case(3, n_tokens=41)
    got = h2o_attention_layer(
        TorchOps(torch.device("cpu"), torch.float64), t(q), t(k), t(v), H2OConfig(8, 16, 2, 3, dense_tail=tail), SCALE
    )
    want_out, want_sets, want_scores = oracle.oracle_h2o_layer(q, k, v, 8, 2, 3, SCALE, tail)
    assert [m.indices.tolist() for m in got.memory_sets] == want_sets
    np.testing.assert_allclose(got.output.numpy(), want_out, atol=1e-12)
    np.testing.assert_allclose(got.scores.numpy(), want_scores, atol=1e-12)


def test_the_step_attentions_take_narrower_values():
    """A model step's attentions (decode, a chunk after a prefix, a window, terms) against the
    explicit softmax over the visible slots."""
    q, k, v, sinks = case(4, n_tokens=12)
    queries, keys, values = t(q[None, :, 8:]), t(k[None]), t(v[None])
    positions, slots = torch.arange(8, 12), torch.arange(12)
    logits = np.einsum("htd,hsd->hts", q[:, 8:], np.repeat(k, 3, axis=0)) * SCALE
    seen = slots.numpy()[None] <= positions.numpy()[:, None]

    def softmax_out(mask, cap=None, sink=None):
        capped = logits if cap is None else np.tanh(logits / cap) * cap
        x = np.where(mask, capped, -np.inf)
        if sink is not None:
            x = np.concatenate([x, np.broadcast_to(sink[:, None, None], (6, 4, 1))], -1)
        w = np.exp(x - x.max(-1, keepdims=True))
        w = (w / w.sum(-1, keepdims=True))[..., :12]
        return w @ np.repeat(v, 3, axis=0)

    # a CPU step of <= 8 queries runs few_queries_cpu's float32 matmuls: float32 rounding
    got = causal_attention(queries, keys, values, SCALE)
    np.testing.assert_allclose(got[0].numpy(), softmax_out(seen), atol=1e-5)
    window = seen & (positions.numpy()[:, None] - slots.numpy()[None] < 3)
    got = windowed_attention(queries, keys, values, SCALE, 3, positions, slots)
    np.testing.assert_allclose(got[0].numpy(), softmax_out(window), atol=1e-5)
    prefill = causal_attention(t(q[None]), keys, values, SCALE)  # a whole prompt: SDPA in float64
    assert prefill.shape == (1, 6, 12, VALUE_DIM)
    np.testing.assert_allclose(prefill[0, :, 8:].numpy(), softmax_out(seen), atol=1e-10)
    chunk = causal_attention(t(q[None, :, 2:]), keys, values, SCALE)  # 10 queries after 2 slots: CPU flash
    # its two flash calls merge in float32 (the log-sum-exp weights): float32 rounding
    np.testing.assert_allclose(chunk[0, :, 6:].numpy(), softmax_out(seen), atol=1e-6)
    got = terms_attention(queries, keys, values, SCALE, AttentionTerms(t(sinks), 2.0), positions, slots)
    np.testing.assert_allclose(got[0].numpy(), softmax_out(seen, 2.0, sinks), atol=1e-6)  # float32 logits


def test_a_kernel_falls_back_to_its_twin_for_narrower_values_said_once(monkeypatch):
    monkeypatch.setattr(dispatch, "kernel_unavailable_reason", lambda device, dtype: None)
    monkeypatch.setattr(dispatch, "triton_kernel", lambda name: pytest.fail(f"kernel {name} launched, Dv < D"))
    monkeypatch.setattr(self_check, "_VALUE_DIM_FALLBACKS", set())
    q, k, v, _ = (t(x, torch.float32) for x in case(5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            intra = intra_attention(q, k, v, 8, SCALE, use_kernel=True)
            inter_attention(q, k, v, SCALE, use_kernel=True)
    said = [str(w.message) for w in caught if issubclass(w.category, SpecfillWarning)]
    assert len(said) == 2 and all("narrower (latent attention)" in line for line in said), said
    want = REFERENCE.intra_attention(*(x.double().numpy() for x in (q, k, v)), 8, SCALE)
    np.testing.assert_allclose(intra.state.o.numpy(), want.state.o, atol=1e-5)  # float32 twin vs float64
