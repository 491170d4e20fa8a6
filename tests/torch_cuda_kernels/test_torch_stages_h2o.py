"""The torch H2O layer (twins, CPU) against the core's oracle, reference and plain attention."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specfill.backends.torch_cuda import method_ops
from specfill.backends.torch_cuda.kernels import inter, intra, intra_attention, merge_states
from specfill.backends.torch_cuda.kernels.state import AttentionState
from specfill.core import H2OCarry, H2OConfig, MemorySet, SpecfillWarning
from specfill.core import h2o_walk as h2o
from specfill.core.reference import REFERENCE, oracle
from specfill.core.reference import h2o as reference_h2o

from .torch_stages_support import assert_close, h2o_layer, randn, torch_ops

torch.set_num_threads(1)

CASES = [  # (N, S, L, H, Hq, Hkv, B)
    (37, 8, 2, 3, 4, 2, 8),
    (50, 8, 0, 4, 6, 2, 16),
    (50, 8, 5, 0, 3, 3, 24),
    (64, 16, 4, 6, 8, 1, 32),
    (41, 8, 3, 4, 8, 4, 40),
]


def _qkv(n, hq, hkv, d=8, dtype=torch.float64, seed=0):
    return (randn(h, n, d, dtype=dtype, seed=seed + i) for i, h in enumerate((hq, hkv, hkv)))


@pytest.mark.parametrize("n,s,local,heavy,hq,hkv,b", CASES)
def test_layer_equals_oracle_float64(n, s, local, heavy, hq, hkv, b):
    q, k, v = _qkv(n, hq, hkv, seed=n)
    got = h2o_layer(q, k, v, H2OConfig(s, b, local, heavy, dense_tail=0), 0.4, use_kernels=False)
    out, memory_sets, scores = oracle.oracle_h2o_layer(q.numpy(), k.numpy(), v.numpy(), s, local, heavy, 0.4)
    np.testing.assert_allclose(got.output.numpy(), out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got.scores.numpy(), scores, rtol=1e-10, atol=1e-10)
    assert [m.indices.tolist() for m in got.memory_sets] == memory_sets


def test_layer_float32_matches_reference_memory_sets_exactly():
    q, k, v = _qkv(75, 6, 2, d=16, dtype=torch.float32, seed=3)
    config = H2OConfig(16, 32, 4, 5, dense_tail=0)
    got = h2o_layer(q, k, v, config, 0.25)
    want = REFERENCE.attention_layer(q.numpy(), k.numpy(), v.numpy(), config, 0.25)
    assert [m.indices.tolist() for m in got.memory_sets] == [m.indices.tolist() for m in want.memory_sets]
    assert got.output.dtype == torch.float32 and got.scores.dtype == torch.float32
    assert_close(got.output, torch.from_numpy(want.output), torch.float32, "output")


def test_batch_by_batch_with_carry_equals_whole_layer():
    """The runtime's batch-major schedule: one call per logical batch, keys growing."""
    q, k, v = _qkv(45, 4, 2, seed=5)
    config = H2OConfig(8, 16, 2, 3, dense_tail=0)
    whole = h2o_layer(q, k, v, config, 0.4)
    carry, outs = H2OCarry(scores=torch.zeros(2, 0, dtype=torch.float64)), []
    for start in range(0, 45, 16):
        end = min(start + 16, 45)
        out, carry = h2o.h2o_attention_batch(
            torch_ops(), q[:, start:end], k[:, :end], v[:, :end], carry, config, 0.4, is_last=end == 45
        )
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), whole.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(carry.scores, whole.scores, rtol=0, atol=1e-12)
    assert carry.n_done == 45 and len(carry.memory_sets) == 5
    assert all(torch.equal(a.indices, b.indices) for a, b in zip(carry.memory_sets, whole.memory_sets))


def test_misaligned_batch_is_rejected():
    q, k, v = _qkv(20, 2, 1)
    carry = H2OCarry(scores=torch.zeros(1, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="chunk boundary"):
        h2o.h2o_attention_batch(
            torch_ops(), q[:, 5:13], k, v, carry, H2OConfig(8, 8, 2, 2, dense_tail=0), 0.4, is_last=False
        )


@pytest.mark.parametrize("n", [1, 7, 8])
def test_prompt_within_one_chunk_is_plain_causal(n):
    q, k, v = _qkv(n, 4, 2, seed=n)
    got = h2o_layer(q, k, v, H2OConfig(8, 16, 2, 3, dense_tail=0), 0.4, use_kernels=False)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4, enable_gqa=True)
    torch.testing.assert_close(got.output, want, rtol=0, atol=1e-12)
    assert got.memory_sets == [] and got.scores.shape == (2, n)


def test_empty_prompt_gives_empty_results():
    q, k, v = _qkv(0, 4, 2)
    got = h2o_layer(q, k, v, H2OConfig(8, 16, 2, 3, dense_tail=0), 0.4, use_kernels=False)
    assert got.output.shape == (4, 0, 8) and got.scores.shape == (2, 0) and got.memory_sets == []


def test_disabled_h2o_is_plain_causal_attention():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecfillWarning)
        config = H2OConfig(8, 16, 0, 0, dense_tail=0)
    assert not config.enabled
    q, k, v = _qkv(30, 4, 2)
    got = h2o_layer(q, k, v, config, 0.4)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4, enable_gqa=True)
    torch.testing.assert_close(got.output, want, rtol=0, atol=1e-12)
    assert got.memory_sets == [] and not bool(got.scores.any())


def test_memory_set_ties_go_to_the_lower_position():
    scores = torch.tensor([[1.0, 2.0, 2.0, 0.5, 2.0, 1.0, 0.0, 0.0]])
    got = method_ops.build_memory_set(scores, None, 0, 0, 8, local=2, heavy=3)
    assert got.indices.tolist() == [[1, 2, 4, 6, 7]]
    previous = MemorySet(torch.tensor([[0, 3]]), 0)
    scores = torch.tensor([[5.0, 0.0, 0.0, 5.0, 5.0, 1.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    got = method_ops.build_memory_set(scores, previous, 1, 4, 12, local=1, heavy=3)
    assert got.indices.tolist() == [[0, 3, 4, 11]]  # 6 (also 5.0) loses the tie to 0, 3, 4


def test_merge_of_intra_halves_equals_whole_attention():
    """Merging states over disjoint key sets is exact, including empty ones."""
    q, k, v = _qkv(1, 2, 2, seed=9)
    keys, values = randn(2, 10, 8, dtype=torch.float64, seed=10), randn(2, 10, 8, dtype=torch.float64, seed=11)
    from specfill.backends.torch_cuda.kernels import inter_attention

    whole = inter_attention(q, keys, values, 0.4, use_kernel=False).state
    a = inter_attention(q, keys[:, :3], values[:, :3], 0.4, use_kernel=False).state
    b = inter_attention(q, keys[:, 3:], values[:, 3:], 0.4, use_kernel=False).state
    empty = inter_attention(q, keys[:, :0], values[:, :0], 0.4, use_kernel=False).state
    merged = merge_states(merge_states(a, empty), b)
    for got, want in zip((merged.m, merged.l, merged.o), (whole.m, whole.l, whole.o)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    both_empty = merge_states(empty, empty)
    assert bool(torch.isneginf(both_empty.m).all()) and bool(torch.isfinite(both_empty.o).all())
    assert not bool(both_empty.l.any())


def test_half_precision_keeps_fp32_statistics():
    q, k, v = _qkv(20, 4, 2, d=16, dtype=torch.float16)
    result = intra_attention(q, k, v, 8, 0.25, use_kernel=False)
    assert result.state.o.dtype == torch.float16
    assert result.state.m.dtype == result.state.l.dtype == result.colsum.dtype == torch.float32
    merged = merge_states(result.state, AttentionState(result.state.m, result.state.l, result.state.o))
    assert merged.o.dtype == torch.float16 and merged.m.dtype == torch.float32


def test_bad_shapes_raise_one_clear_error():
    q, k, v = _qkv(10, 3, 2)
    with pytest.raises(ValueError, match="multiple of 2 KV heads"):
        intra_attention(q, k, v, 4, 0.4)
    q, k, v = _qkv(10, 4, 2)
    with pytest.raises(ValueError, match="one key per query"):
        intra_attention(q, k[:, :5], v[:, :5], 4, 0.4)


def _numpy_state_close(got, want, what: str) -> None:
    for name, g, w in zip(("m", "l", "o"), (got.m, got.l, got.o), (want.m, want.l, want.o)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-12, atol=1e-12, err_msg=f"{what}.{name}")


@pytest.mark.parametrize("block", [None, 5, 64])
@pytest.mark.parametrize("n,s", [(150, 70), (77, 32), (40, 40)])
def test_twins_query_blocks_equal_the_numpy_reference(monkeypatch, block, n, s):
    """The twins walk query rows in blocks and skip keys after a block: chunks of several blocks,
    chunks not a block multiple, a partial last chunk, GQA 3; m and l each, not just m + log l."""
    if block is not None:
        monkeypatch.setattr(intra, "_TWIN_QUERY_BLOCK", block)
        monkeypatch.setattr(inter, "_TWIN_QUERY_BLOCK", block)
    q, k, v = _qkv(n, 6, 2, seed=n + s)
    got = intra.intra_attention_twin(q, k, v, s, 0.4)
    want = reference_h2o.intra_attention(q.numpy(), k.numpy(), v.numpy(), s, 0.4)
    _numpy_state_close(got.state, want.state, "intra")
    np.testing.assert_allclose(got.colsum.numpy(), want.colsum, rtol=1e-12, atol=1e-12)
    k_mem, v_mem = (randn(2, 19, 8, dtype=torch.float64, seed=seed) for seed in (1, 2))
    got = inter.inter_attention_twin(q, k_mem, v_mem, 0.4)
    want = reference_h2o.inter_attention(q.numpy(), k_mem.numpy(), v_mem.numpy(), 0.4)
    _numpy_state_close(got.state, want.state, "inter")
    np.testing.assert_allclose(got.colsum.numpy(), want.colsum, rtol=1e-12, atol=1e-12)
