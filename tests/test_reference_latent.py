"""Latent attention's shapes (deepseek_v3, kimi_k25: keys of qk_nope + qk_rope dims, values of a
narrower v_head_dim) in the NumPy reference: the H2O walk against the naive oracle, the stages'
outputs of the values' width, SpecPrefill's scores (keys only) unchanged, and the reference KV
cache holding keys and values of different widths through writes, growth, copies and files."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.config import H2OConfig
from specfill.core.reference import REFERENCE, oracle
from specfill.core.reference.kv_cache import ReferenceKVCache
from specfill.core.stages import AttentionTerms

SCALE = 0.2
KEY_DIM, VALUE_DIM = 24, 16  # qk_nope 16 + qk_rope 8, v_head_dim 16: the test checkpoints' shapes


def tensors(seed: int, n_heads: int = 4, n_kv: int = 2, n_tokens: int = 45):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n_heads, n_tokens, KEY_DIM)) * 2.0,
        rng.normal(size=(n_kv, n_tokens, KEY_DIM)),
        rng.normal(size=(n_kv, n_tokens, VALUE_DIM)),
        rng.normal(size=n_heads) * 2.0,
    )


@pytest.mark.parametrize("window,tail,terms", [(None, 0, False), (11, 0, False), (None, 10, True), (11, 13, True)])
def test_the_walk_over_narrower_values_equals_the_oracle(window, tail, terms):
    q, k, v, sinks = tensors(5)
    layer_terms = AttentionTerms(sinks, 2.0) if terms else None
    got = REFERENCE.attention_layer(q, k, v, H2OConfig(8, 16, 2, 3, dense_tail=tail), SCALE, window, layer_terms)
    want_out, want_sets, want_scores = oracle.oracle_h2o_layer(
        q, k, v, 8, 2, 3, SCALE, tail, window, sinks=sinks if terms else None, softcap=2.0 if terms else None
    )
    assert got.output.shape == (4, 45, VALUE_DIM)
    assert [m.indices.tolist() for m in got.memory_sets] == want_sets
    np.testing.assert_allclose(got.output, want_out, atol=1e-12)
    np.testing.assert_allclose(got.scores, want_scores, atol=1e-12)
    replay_out, replay_scores = oracle.replay_h2o_layer(
        q, k, v, 8, [m.indices for m in got.memory_sets], SCALE, tail, window,
        sinks=sinks if terms else None, softcap=2.0 if terms else None,
    )  # fmt: skip
    np.testing.assert_allclose(got.output, replay_out, atol=1e-12)
    np.testing.assert_allclose(got.scores, replay_scores, atol=1e-12)


def test_values_zero_padded_to_the_key_width_change_only_the_padding():
    """Zero columns appended to the values give the same memory sets and scores (they depend on
    q.k only) and the same outputs in the first Dv columns, zeros after: the exactness the torch
    adapter's padded cache rests on (docs/models.md)."""
    q, k, v, _ = tensors(6)
    config = H2OConfig(8, 16, 2, 3, dense_tail=0)
    narrow = REFERENCE.attention_layer(q, k, v, config, SCALE)
    padded = REFERENCE.attention_layer(q, k, np.pad(v, ((0, 0), (0, 0), (0, KEY_DIM - VALUE_DIM))), config, SCALE)
    assert [m.indices.tolist() for m in narrow.memory_sets] == [m.indices.tolist() for m in padded.memory_sets]
    np.testing.assert_array_equal(narrow.scores, padded.scores)
    np.testing.assert_allclose(padded.output[..., :VALUE_DIM], narrow.output, atol=1e-14)
    assert not padded.output[..., VALUE_DIM:].any()


def test_the_stages_give_outputs_of_the_values_width():
    q, k, v, _ = tensors(7, n_tokens=16)
    intra = REFERENCE.intra_attention(q, k, v, 8, SCALE)
    inter = REFERENCE.inter_attention(q[:, 8:], k[:, :8], v[:, :8], SCALE)
    empty = REFERENCE.inter_attention(q[:, 8:], k[:, :0], v[:, :0], SCALE)
    assert intra.state.o.shape == (4, 16, VALUE_DIM) and inter.state.o.shape == (4, 8, VALUE_DIM)
    assert empty.state.o.shape == (4, 8, VALUE_DIM)
    merged = REFERENCE.merge_states(inter.state, intra.state.rows(8, 16))
    logits = np.einsum("htd,hjd->htj", q[:, 8:], np.repeat(k, 2, axis=0)) * SCALE
    logits = np.where(np.arange(16)[None] <= np.arange(8, 16)[:, None], logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(merged.o, (weights / weights.sum(-1, keepdims=True)) @ np.repeat(v, 2, 0), atol=1e-12)


def test_the_reference_kv_cache_holds_keys_and_values_of_different_widths(tmp_path):
    rng = np.random.default_rng(8)
    cache = ReferenceKVCache(2, 3, KEY_DIM, 6, value_dim=VALUE_DIM)
    keys, values = rng.normal(size=(1, 3, 4, KEY_DIM)), rng.normal(size=(1, 3, 4, VALUE_DIM))
    for layer in cache.layers:
        got_k, got_v = layer.update_and_fetch(keys, values)
    assert got_k.shape == (1, 3, 4, KEY_DIM) and got_v.shape == (1, 3, 4, VALUE_DIM)
    for other in (cache.grown(12), cache.copy(3, 8)):
        assert other.layers[1].v.shape[3] == VALUE_DIM and other.layers[1].k.shape[3] == KEY_DIM
        np.testing.assert_array_equal(other.layers[1].v[:, :, :3], values[:, :, :3])
    cache.save(str(tmp_path / "c.safetensors"), 4, {})
    back = ReferenceKVCache(2, 3, KEY_DIM, 5, value_dim=VALUE_DIM)
    assert back.load(str(tmp_path / "c.safetensors")) == 4
    np.testing.assert_array_equal(back.layers[0].v[:, :, :4], values)
    with pytest.raises(ValueError):  # a cache of equal widths does not take the file
        ReferenceKVCache(2, 3, KEY_DIM, 5).load(str(tmp_path / "c.safetensors"))
