"""H2O's stages on torch's CPU flash kernel (kernels/cpu_flash.py) against the twins, and when it runs."""

import pytest
import torch

from specfill.backends.torch_cuda.kernels import cpu_flash, inter, intra
from specfill.core import H2OConfig
from specfill.core.stages import AttentionTerms

from .torch_stages_support import assert_close, h2o_layer, randn

torch.set_num_threads(1)

# the column sums' relative bound: the swapped pass's bias split in two 16-bit numbers (~2^-16 of
# lse / scale, times scale) and its float32 exp; 2e-3 leaves ~10x room over what these cases give
COLSUM_RTOL = 2e-3
# the log-sum-exps: float32 sums of the same exact products in another order, and the kernel's own
# exp / log (measured up to 6e-5 at log-sum-exps near 10)
LSE_ATOL = 3e-4


def _qkv(n_heads, n_kv, n_tokens, n_keys, dtype, head_dim=32, seed=0):
    # scale 2: logits of a few units, as a model's, so that the softmaxes are far from uniform
    q = randn(n_heads, n_tokens, head_dim, dtype=dtype, seed=seed, scale=2.0)
    k = randn(n_kv, n_keys, head_dim, dtype=dtype, seed=seed + 1, scale=2.0)
    v = randn(n_kv, n_keys, head_dim, dtype=dtype, seed=seed + 2)
    return q, k, v


def _lse(state):
    return state.m.double() + torch.log(state.l.double())


def _assert_lse(got_state, want_state):
    err = (_lse(got_state) - _lse(want_state)).abs().max()
    assert float(err) <= LSE_ATOL, f"log-sum-exp: max error {float(err)}"


def _assert_colsum(got, want):
    assert got.dtype == torch.float32 and got.shape == want.shape
    rel = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-6)).max()
    assert float(rel) <= COLSUM_RTOL, f"column sums: max relative error {float(rel)}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_heads,n_kv,n_tokens,chunk", [(4, 2, 37, 8), (3, 3, 64, 16), (6, 1, 50, 50), (2, 2, 5, 8)])
def test_intra_matches_the_twin(dtype, n_heads, n_kv, n_tokens, chunk):
    q, k, v = _qkv(n_heads, n_kv, n_tokens, n_tokens, dtype)
    got = cpu_flash.intra_attention_flash(q, k, v, chunk, 0.3)
    want = intra.intra_attention_twin(q, k, v, chunk, 0.3)
    assert got.state.o.dtype == dtype and got.state.m.dtype == torch.float32
    assert_close(got.state.o, want.state.o, dtype, "o")
    _assert_lse(got.state, want.state)
    _assert_colsum(got.colsum, want.colsum)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_intra_with_the_kernels_gqa_gives_the_repeated_heads_numbers(dtype):
    """Phase 1 hands the kernel the unrepeated key and value heads (it maps query heads onto them
    itself); with them repeated per head every output, log-sum-exp and column sum has the same bits
    (full chunks and a partial last one)."""
    q, k, v = _qkv(6, 2, 37, 37, dtype, seed=11)
    native = cpu_flash.intra_attention_flash(q, k, v, 16, 0.3)
    repeated = cpu_flash.intra_attention_flash(q, k.repeat_interleave(3, 0), v.repeat_interleave(3, 0), 16, 0.3)
    for name in ("o", "m"):
        assert torch.equal(getattr(native.state, name), getattr(repeated.state, name)), name
    assert torch.equal(native.colsum, repeated.colsum)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_heads,n_kv,n_tokens,n_mem", [(4, 2, 16, 24), (3, 3, 9, 40), (6, 1, 1, 7)])
def test_inter_matches_the_twin(dtype, n_heads, n_kv, n_tokens, n_mem):
    q, _, _ = _qkv(n_heads, n_kv, n_tokens, n_tokens, dtype, seed=5)
    _, k_mem, v_mem = _qkv(n_heads, n_kv, n_tokens, n_mem, dtype, seed=9)
    got = cpu_flash.inter_attention_flash(q, k_mem, v_mem, 0.3)
    want = inter.inter_attention_twin(q, k_mem, v_mem, 0.3)
    assert_close(got.state.o, want.state.o, dtype, "o")
    _assert_lse(got.state, want.state)
    _assert_colsum(got.colsum, want.colsum)


def test_sinks_join_the_column_sums_only():
    q, k, v = _qkv(4, 2, 24, 24, torch.bfloat16, seed=3)
    terms = AttentionTerms(sinks=torch.tensor([0.5, 3.0, -1.0, 6.0]))
    got = cpu_flash.intra_attention_flash(q, k, v, 8, 0.3, terms=terms)
    want = intra.intra_attention_twin(q, k, v, 8, 0.3, terms=terms)
    _assert_lse(got.state, want.state)
    _assert_colsum(got.colsum, want.colsum)
    plain = cpu_flash.intra_attention_flash(q, k, v, 8, 0.3)
    # a sink takes some of each row's weight (a sink far below a row's log-sum-exp: too little to see)
    assert bool((got.colsum <= plain.colsum).all()) and bool((got.colsum < 0.9 * plain.colsum).any())
    got = cpu_flash.inter_attention_flash(q, k[:, :10], v[:, :10], 0.3, terms=terms)
    _assert_colsum(got.colsum, inter.inter_attention_twin(q, k[:, :10], v[:, :10], 0.3, terms=terms).colsum)


def test_large_log_sum_exps_spread_across_rows():
    """Rows whose log-sum-exps differ by ~200 (beyond what one float could carry as exp(-lse)):
    the bias rides in the logits, so every row's share of a column still counts."""
    q, k, v = _qkv(2, 1, 16, 16, torch.bfloat16, seed=11)
    q[:, ::2] *= 12.0
    got = cpu_flash.intra_attention_flash(q, k, v, 16, 0.5)
    want = intra.intra_attention_twin(q, k, v, 16, 0.5)
    spread = _lse(want.state).amax() - _lse(want.state).amin()
    assert float(spread) > 100
    _assert_colsum(got.colsum, want.colsum)


def test_h2o_layer_on_flash_keeps_the_twins_memory_sets():
    q, k, v = _qkv(6, 2, 150, 150, torch.bfloat16, seed=21)
    config = H2OConfig(32, 64, 8, 8, dense_tail=0)
    got = h2o_layer(q, k, v, config, 0.25, use_kernels=None)
    want = h2o_layer(q, k, v, config, 0.25, use_kernels=False)
    assert [m.indices.tolist() for m in got.memory_sets] == [m.indices.tolist() for m in want.memory_sets]
    assert_close(got.output, want.output, torch.bfloat16, "output")
    assert_close(got.scores, want.scores, torch.bfloat16, "scores")


def test_dispatch(monkeypatch):
    q16, k16, v16 = _qkv(4, 2, 12, 12, torch.bfloat16)
    calls = []
    monkeypatch.setattr(intra, "intra_attention_flash", lambda *a, **kw: calls.append("intra"))
    monkeypatch.setattr(inter, "inter_attention_flash", lambda *a, **kw: calls.append("inter"))
    intra.intra_attention(q16, k16, v16, 4, 0.3)
    inter.inter_attention(q16, k16, v16, 0.3)
    assert calls == ["intra", "inter"]
    # the twin: float32, forced twins, a window, a soft-cap, narrower values
    intra.intra_attention(q16.float(), k16.float(), v16.float(), 4, 0.3)
    intra.intra_attention(q16, k16, v16, 4, 0.3, use_kernel=False)
    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    intra.intra_attention(q16, k16, v16, 4, 0.3)
    monkeypatch.delenv("SPECFILL_KERNELS")
    intra.intra_attention(q16, k16, v16, 4, 0.3, window=3)
    intra.intra_attention(q16, k16, v16, 4, 0.3, terms=AttentionTerms(softcap=20.0))
    inter.inter_attention(q16, k16, v16[..., :16].contiguous(), 0.3)
    assert calls == ["intra", "inter"]


def test_the_swapped_pass_hands_the_kernel_values_with_row_strides(monkeypatch):
    """The swapped pass's values are never read, but torch's CPU kernel ran 40-100x slower on values
    with zero-stride rows whenever its key count (the real queries: a short last chunk, a dense-tail
    block) was under 64 (kernels/cpu_flash._column_sums): zeros broadcast over batch and
    heads only, in both stages (a partial chunk of 29 queries here)."""
    strides = []
    real = cpu_flash._flash

    def spy(q, k, v, causal, scale):
        strides.append(v.stride(-2))
        return real(q, k, v, causal, scale)

    monkeypatch.setattr(cpu_flash, "_flash", spy)
    q, k, v = _qkv(4, 2, 29, 300, torch.bfloat16)
    cpu_flash.inter_attention_flash(q, k, v, 0.2)
    cpu_flash.intra_attention_flash(q, k[:, :29], v[:, :29], 16, 0.2)
    assert len(strides) == 6 and all(s != 0 for s in strides)  # inter: a call and its swapped pass; intra: 16 + 13
