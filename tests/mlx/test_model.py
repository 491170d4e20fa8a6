"""RoPE at explicit positions, the slot-addressed KV cache, stepped prefill and decode, and a
speculative-prefill-shaped cache (kept tokens in slots 0..K-1 at their original positions)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx import load
from specfill.backends.mlx.cache import LayerKVCache, make_cache
from specfill.backends.mlx.rope import RoPE
from specfill.core.errors import PromptTooLongError
from specfill.core.methods.prefill import prefill
from specfill.core.models import ModelArgs
from specfill.core.rope import rope_inv_freq
from tests.fixtures import LLAMA3_ROPE
from tests.mlx.conftest import prompt_ids

ARGS = ModelArgs(
    architecture="llama",
    vocab_size=16,
    hidden_size=96,
    intermediate_size=8,
    num_hidden_layers=1,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=32,
    rope_theta=500000.0,
    rope_scaling=dict(LLAMA3_ROPE),
)


def rope_reference(x: np.ndarray, positions: np.ndarray, args: ModelArgs) -> np.ndarray:
    """Half-split RoPE in float64 from cos/sin of position * inverse frequency; x [T, H, D]."""
    angles = positions[:, None].astype(np.float64) * rope_inv_freq(args).astype(np.float64)[None]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@pytest.mark.parametrize(
    "positions,tolerance", [([0, 1, 3, 6, 7, 200, 4000], 5e-4), ([17], 2e-5), (list(range(5, 12)), 2e-5)]
)
def test_rope_at_explicit_positions_matches_cos_sin_reference(positions, tolerance):
    """Against float64; float32 angles lose ~position * 6e-8 rad (2.4e-4 at 4000)."""
    x = mx.random.normal((1, len(positions), 3, 32), key=mx.random.key(len(positions)))
    rope = RoPE(ARGS)
    out = rope(x, mx.array(positions))
    assert out.shape == (1, 3, len(positions), 32)
    expected = rope_reference(np.asarray(x[0]), np.array(positions), ARGS)
    np.testing.assert_allclose(np.asarray(out[0]).swapaxes(0, 1), expected, atol=tolerance)


def test_rope_contiguous_offset_equals_explicit_positions_bit_for_bit():
    x = mx.random.normal((1, 9, 3, 32), key=mx.random.key(1))
    rope = RoPE(ARGS)
    np.testing.assert_array_equal(np.asarray(rope(x, 40)), np.asarray(rope(x, mx.arange(40, 49))))


def test_cache_appends_by_slot_and_grows():
    cache = LayerKVCache()
    first = mx.ones((1, 2, 3, 4))
    keys, values = cache.update_and_fetch(first, 2 * first)
    assert cache.offset == 3 and keys.shape == (1, 2, 3, 4) and cache.capacity == LayerKVCache.step
    keys, values = cache.update_and_fetch(3 * mx.ones((1, 2, 300, 4)), mx.zeros((1, 2, 300, 4)))
    assert cache.offset == 303 and keys.shape == (1, 2, 303, 4) and cache.capacity == 512
    assert float(keys[0, 0, 2, 0]) == 1.0 and float(keys[0, 0, 3, 0]) == 3.0
    assert float(values[0, 1, 0, 0]) == 2.0


def test_cache_with_capacity_refuses_to_overflow():
    cache = LayerKVCache(capacity=4)
    kv = mx.zeros((1, 2, 3, 4))
    cache.update_and_fetch(kv, kv)
    assert cache.capacity == 4
    with pytest.raises(PromptTooLongError, match="holds 4 tokens"):
        cache.update_and_fetch(kv, kv)


@pytest.fixture(scope="module")
def qwen3(tiny_checkpoint):
    directory = tiny_checkpoint("qwen3", "safetensors")
    model, _ = load(directory, dtype="float32", device="cpu")
    return model, directory


@pytest.mark.parametrize("step_size", [1, 7, 64])
def test_stepped_prefill_with_cache_equals_one_pass(qwen3, transformers_logits, step_size):
    model, directory = qwen3
    ids = prompt_ids(30, vocab=model.args.vocab_size, seed=11)
    expected = transformers_logits(directory, ids)
    cache = make_cache(model.args)
    logits = prefill(model.ops, model.model, mx.array(ids), 0, cache, step_size=step_size, logits_from=-5)
    assert logits.shape == (5, model.args.vocab_size) and cache[0].offset == 30
    assert np.abs(np.asarray(logits) - expected[-5:]).max() <= 1e-4


def test_decode_one_token_at_a_time_equals_one_pass(qwen3, transformers_logits):
    model, directory = qwen3
    ids = prompt_ids(20, vocab=model.args.vocab_size, seed=12)
    expected = transformers_logits(directory, ids)
    cache = make_cache(model.args)
    prefill(model.ops, model.model, mx.array(ids[:12]), 0, cache, step_size=2048)
    for position in range(12, 20):
        logits = model.model(mx.array([[ids[position]]]), position, cache)
        assert np.abs(np.asarray(logits[0, -1]) - expected[position]).max() <= 1e-4


def test_kept_tokens_in_slots_at_original_positions_then_decode(qwen3, transformers_logits):
    """Speculative prefill's cache: K kept tokens in slots 0..K-1 at their original positions,
    then the next token at position P (the prompt length) in slot K."""
    model, directory = qwen3
    prompt = prompt_ids(24, vocab=model.args.vocab_size, seed=13)
    kept = [0, 1, 2, 5, 6, 11, 12, 13, 20, 23]
    next_token = 7
    expected = transformers_logits(directory, [prompt[i] for i in kept] + [next_token], position_ids=kept + [24])
    cache = make_cache(model.args)
    logits = prefill(
        model.ops, model.model, mx.array([prompt[i] for i in kept]), np.array(kept), cache, step_size=4, logits_from=0
    )
    assert np.abs(np.asarray(logits) - expected[:-1]).max() <= 1e-4
    step = model.model(mx.array([[next_token]]), 24, cache)
    assert cache[0].offset == len(kept) + 1
    assert np.abs(np.asarray(step[0, -1]) - expected[-1]).max() <= 1e-4
