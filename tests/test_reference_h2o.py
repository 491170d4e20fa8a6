"""The two-phase H2O reference against the naive oracle over explicit key sets (seed 001)."""

import numpy as np
import pytest

from specfill.core import H2OConfig
from specfill.core.methods import h2o as methods_h2o
from specfill.core.reference import REFERENCE, oracle

CASES = [  # (N, S, L, H, Hq, Hkv, B)
    (37, 8, 2, 3, 4, 2, 8),
    (50, 8, 0, 4, 6, 2, 16),
    (50, 8, 5, 0, 3, 3, 24),
    (5, 8, 2, 2, 2, 1, 8),
    (64, 16, 4, 6, 8, 1, 32),
    (41, 8, 3, 4, 8, 4, 40),
]


@pytest.mark.parametrize("n,s,local,heavy,hq,hkv,b", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_phase_equals_oracle_float64(n, s, local, heavy, hq, hkv, b, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(hq, n, 8)), rng.normal(size=(hkv, n, 8)), rng.normal(size=(hkv, n, 8))
    result = REFERENCE.attention_layer(q, k, v, H2OConfig(s, b, local, heavy, dense_tail=0), scale=0.4)
    out, memory_sets, scores = oracle.oracle_h2o_layer(q, k, v, s, local, heavy, scale=0.4)
    np.testing.assert_allclose(result.output, out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.scores, scores, rtol=1e-10, atol=1e-10)
    assert len(result.memory_sets) == len(memory_sets) == max(0, -(-n // s) - 1)
    for built, expected in zip(result.memory_sets, memory_sets):
        assert built.indices.tolist() == expected


def test_dot_product_count_of_seed_001():
    assert methods_h2o.h2o_dot_products(4096, 1024, 512) == 3_672_064
    assert methods_h2o.full_dot_products(4096) == 8_390_656


def test_dot_products_equal_the_key_sets_actually_used():
    """Count |K(i)| over a real run (N=4096, S=1024, L=H=256): the formula is what is computed."""
    rng = np.random.default_rng(0)
    n = 4096
    q, k, v = (rng.normal(size=(1, n, 4)).astype(np.float32) for _ in range(3))
    result = REFERENCE.attention_layer(q, k, v, H2OConfig(1024, 4096, 256, 256, dense_tail=0), scale=0.5)
    mask = oracle.key_set_mask(n, 1024, [m.indices for m in result.memory_sets], 1)
    assert int(mask[0].sum()) == 3_672_064


WINDOW_CASES = [  # (N, S, L, H, Hq, Hkv, B, W, window)
    (37, 8, 2, 3, 4, 2, 8, 0, 5),  # window inside a chunk
    (50, 8, 2, 4, 6, 2, 16, 0, 12),  # window spans a chunk boundary
    (50, 8, 3, 3, 4, 1, 24, 13, 6),  # with a dense tail across chunks
    (41, 8, 0, 4, 4, 2, 40, 0, 1),  # w = 1: each query sees itself only
    (30, 8, 2, 3, 4, 2, 8, 4, 100),  # a window longer than the prompt changes nothing
]


@pytest.mark.parametrize("n,s,local,heavy,hq,hkv,b,tail,window", WINDOW_CASES)
def test_sliding_window_two_phase_equals_oracle_float64(n, s, local, heavy, hq, hkv, b, tail, window):
    """A sliding layer: every key set of the walk intersected with {j > i - w}, scores included."""
    rng = np.random.default_rng(n + window)
    q, k, v = rng.normal(size=(hq, n, 8)), rng.normal(size=(hkv, n, 8)), rng.normal(size=(hkv, n, 8))
    config = H2OConfig(s, b, local, heavy, dense_tail=tail)
    result = REFERENCE.attention_layer(q, k, v, config, scale=0.4, window=window)
    out, memory_sets, scores = oracle.oracle_h2o_layer(q, k, v, s, local, heavy, 0.4, tail, window)
    np.testing.assert_allclose(result.output, out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.scores, scores, rtol=1e-10, atol=1e-10)
    assert [m.indices.tolist() for m in result.memory_sets] == memory_sets
    replay_out, replay_scores = oracle.replay_h2o_layer(
        q, k, v, s, [np.array(m) for m in memory_sets], 0.4, tail, window
    )
    np.testing.assert_allclose(replay_out, out, atol=1e-10)
    np.testing.assert_allclose(replay_scores, scores, atol=1e-10)
    unwindowed = REFERENCE.attention_layer(q, k, v, config, scale=0.4)
    assert (np.abs(unwindowed.output - out).max() > 1e-3) == (window < n)


def test_dense_tail_asks_for_no_column_sums():
    """The dense tail reads its blocks' states only (its rows' scores are the walk's): its stage calls
    ask for no column sums, the walk's own calls do, and the layer still equals the oracle."""
    from specfill.core.reference import ReferenceStages

    asked = []

    class Recording(ReferenceStages):
        def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True):
            asked.append(("intra", with_colsum))
            got = super().intra_attention(q, k, v, chunk_size, scale, window, terms, with_colsum)
            assert (got.colsum is None) == (not with_colsum)
            return got

        def inter_attention(self, q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True):
            asked.append(("inter", with_colsum))
            got = super().inter_attention(q, k_mem, v_mem, scale, window, terms, with_colsum)
            assert (got.colsum is None) == (not with_colsum)
            return got

    rng = np.random.default_rng(3)
    n, s, tail = 50, 8, 13  # the tail spans two chunk lines: three blocks, each intra + inter
    q, k, v = rng.normal(size=(4, n, 8)), rng.normal(size=(2, n, 8)), rng.normal(size=(2, n, 8))
    result = Recording().attention_layer(q, k, v, H2OConfig(s, 24, 3, 3, dense_tail=tail), scale=0.4)
    out, _, scores = oracle.oracle_h2o_layer(q, k, v, s, 3, 3, 0.4, tail)
    np.testing.assert_allclose(result.output, out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.scores, scores, rtol=1e-10, atol=1e-10)
    assert asked.count(("intra", False)) == 3 and asked.count(("inter", False)) == 3
    assert ("intra", True) in asked and ("inter", True) in asked
