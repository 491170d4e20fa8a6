"""H2O on MLX (twins): the whole-layer orchestration against the naive oracle of seed 001,
logical-batch carry, the N <= S and L + H = 0 edges, and memory-set ranking rules."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx.method_ops import accumulate_scores, build_memory_set
from specfill.backends.mlx.ops import MLXOps
from specfill.core import H2OCarry, H2OConfig, MemorySet
from specfill.core import h2o_walk as h2o
from specfill.core.reference import REFERENCE, oracle
from specfill.core.reference.h2o import causal_attention

SCALE = 0.25


def ops(use_kernels: bool | None) -> MLXOps:
    return MLXOps(mx.default_device(), use_kernels)


def h2o_attention_layer(q, k, v, config, scale, use_kernels=False):
    """The core's one walk over the MLX ops."""
    return h2o.h2o_attention_layer(ops(use_kernels), q, k, v, config, scale)


def h2o_attention_batch(q, k, v, carry, config, scale, is_last, use_kernels=False):
    return h2o.h2o_attention_batch(ops(use_kernels), q, k, v, carry, config, scale, is_last)


def start_carry(n_kv_heads: int) -> H2OCarry:
    return H2OCarry(scores=mx.zeros((n_kv_heads, 0), dtype=mx.float32))


def prompt(seed: int, n_heads: int, n_kv: int, n_tokens: int, head_dim: int = 16):
    rng = np.random.default_rng(seed)
    host = [rng.normal(size=(h, n_tokens, head_dim)).astype(np.float32) for h in (n_heads, n_kv, n_kv)]
    return [mx.array(h) for h in host], [h.astype(np.float64) for h in host]


@pytest.mark.parametrize(
    "n_tokens,chunk,batch,local,heavy,n_heads,n_kv",
    [
        (41, 8, 16, 2, 3, 4, 2),  # partial last chunk, logical batches of 2 chunks
        (32, 8, 8, 0, 4, 6, 2),  # L = 0, one chunk per logical batch, full last chunk
        (27, 8, 32, 4, 0, 3, 3),  # H = 0, no GQA
        (50, 16, 32, 5, 6, 8, 2),  # group of 4
    ],
)
def test_layer_matches_the_oracle(n_tokens, chunk, batch, local, heavy, n_heads, n_kv):
    (q, k, v), (qn, kn, vn) = prompt(n_tokens, n_heads, n_kv, n_tokens)
    got = h2o_attention_layer(q, k, v, H2OConfig(chunk, batch, local, heavy, dense_tail=0), SCALE, use_kernels=False)
    out, sets, scores = oracle.oracle_h2o_layer(qn, kn, vn, chunk, local, heavy, SCALE)
    assert [np.array(m.indices).tolist() for m in got.memory_sets] == sets
    assert [m.chunk_index for m in got.memory_sets] == list(range(math.ceil(n_tokens / chunk) - 1))
    assert got.output.dtype == mx.float32 and got.scores.dtype == mx.float32
    np.testing.assert_allclose(np.array(got.output), out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.array(got.scores), scores, atol=2e-5, rtol=2e-5)


def test_logical_batches_carried_by_the_caller_match_one_call():
    """The model's schedule: per logical batch the KV cache holds only the keys so far."""
    (q, k, v), _ = prompt(7, 4, 2, 45)
    config = H2OConfig(chunk_size=8, batch_size=16, local=2, heavy=3, dense_tail=0)
    carry = start_carry(2)
    outputs = []
    for start in range(0, 45, 16):
        end = min(start + 16, 45)
        out, carry = h2o_attention_batch(
            q[:, start:end], k[:, :end], v[:, :end], carry, config, SCALE, is_last=end == 45, use_kernels=False
        )
        outputs.append(out)
    whole = h2o_attention_layer(q, k, v, H2OConfig(8, 64, 2, 3, dense_tail=0), SCALE, use_kernels=False)
    assert carry.n_done == 45
    assert [np.array(m.indices).tolist() for m in carry.memory_sets] == [
        np.array(m.indices).tolist() for m in whole.memory_sets
    ]
    np.testing.assert_allclose(np.array(mx.concatenate(outputs, axis=1)), np.array(whole.output), atol=1e-6)
    np.testing.assert_allclose(np.array(carry.scores), np.array(whole.scores), atol=1e-6)


def test_a_prompt_within_one_chunk_is_plain_causal_attention():
    (q, k, v), (qn, kn, vn) = prompt(1, 4, 2, 8)
    got = h2o_attention_layer(q, k, v, H2OConfig(8, 16, 2, 3, dense_tail=0), SCALE, use_kernels=False)
    assert got.memory_sets == []
    np.testing.assert_allclose(np.array(got.output), causal_attention(qn, kn, vn, SCALE).o, atol=2e-6)
    want = REFERENCE.attention_layer(qn, kn, vn, H2OConfig(8, 16, 2, 3, dense_tail=0), SCALE)
    np.testing.assert_allclose(np.array(got.scores), want.scores, atol=2e-6)


def test_h2o_disabled_is_plain_causal_attention():
    (q, k, v), (qn, kn, vn) = prompt(2, 6, 2, 30)
    got = h2o_attention_layer(q, k, v, H2OConfig(8, 16, 0, 0, dense_tail=0), SCALE, use_kernels=False)
    assert got.memory_sets == [] and not np.array(got.scores).any()
    np.testing.assert_allclose(np.array(got.output), causal_attention(qn, kn, vn, SCALE).o, atol=2e-6)


def test_equal_scores_rank_the_lower_position_first():
    previous = MemorySet(mx.array([[1, 5, 6], [0, 2, 7]], dtype=mx.int32), chunk_index=0)
    scores = mx.zeros((2, 16))
    got = build_memory_set(scores, previous, chunk_index=1, chunk_start=8, chunk_end=16, local=2, heavy=4)
    # local tail 14, 15; heavy: the 4 lowest candidate positions of M_0 U {8..13}
    assert np.array(got.indices).tolist() == [[1, 5, 6, 8, 14, 15], [0, 2, 7, 8, 14, 15]]
    scores = scores.at[0, 13].add(1.0).at[1, 2].add(-1.0)
    got = build_memory_set(scores, previous, 1, 8, 16, 2, 4)
    assert np.array(got.indices).tolist() == [[1, 5, 6, 13, 14, 15], [0, 7, 8, 9, 14, 15]]


def test_build_memory_set_never_picks_the_local_window_twice():
    scores = mx.array(np.arange(8, dtype=np.float32)[None])  # the tail scores highest
    got = build_memory_set(scores, None, 0, 0, 8, local=3, heavy=2)
    assert np.array(got.indices).tolist() == [[3, 4, 5, 6, 7]] and got.size == 5


def test_accumulate_scores_adds_at_each_kv_heads_memory_positions():
    memory = MemorySet(mx.array([[0, 3], [1, 2]], dtype=mx.int32), 0)
    got = accumulate_scores(mx.ones((2, 4)), memory, mx.array([[0.5, 2.0], [1.0, 3.0]]))
    assert np.array(got).tolist() == [[1.5, 1.0, 1.0, 3.0], [1.0, 2.0, 4.0, 1.0]]


def test_batches_must_start_on_chunk_boundaries_and_only_the_last_chunk_may_be_partial():
    (q, k, v), _ = prompt(3, 2, 2, 20)
    config = H2OConfig(8, 8, 1, 1, dense_tail=0)
    with pytest.raises(ValueError, match="chunk boundary"):
        h2o_attention_batch(q[:, 4:12], k, v, H2OCarry(scores=mx.zeros((2, 4))), config, SCALE, False)
    with pytest.raises(ValueError, match="final chunk"):
        h2o_attention_batch(q[:, :12], k, v, start_carry(2), config, SCALE, is_last=False)
