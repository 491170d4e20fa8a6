"""Triton kernels against their torch twins, and the conformance suite with kernels forced.

Not collected by the main run (the name does not start with test_): test_torch_stages_kernels.py
runs this file in two subprocesses (halves), under TRITON_INTERPRET=1 with CPU tensors when there is no GPU
(Triton decides at decoration time whether it interprets), on CUDA otherwise. Shapes stay tiny:
the interpreter runs every tile in NumPy.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from specfill.backends.torch_cuda.kernels import attention_scores, choose_kernel, inter_attention, intra_attention
from specfill.backends.torch_cuda.kernels.flash_triton import flash_attention
from specfill.backends.torch_cuda.kernels.scoring_triton import scoring_softmax
from specfill.conformance import CHECK_GROUPS, run_group
from specfill.core import H2OConfig, SpecfillWarning, SpecPrefillConfig

from .torch_stages_support import DEVICE, DTYPES, GPU_DTYPES, assert_close, h2o_layer, importance, randn

torch.set_num_threads(1)


def test_kernels_are_runnable_here():
    """Guards against this file silently testing twin against twin."""
    x = torch.zeros(1, 1, 16, device=DEVICE)
    assert choose_kernel(None, x) == (DEVICE == "cuda")
    assert choose_kernel(True, x)


def _state_close(got, want, dtype, what):
    assert_close(got.m, want.m, torch.float32, f"{what}.m")
    assert_close(got.l, want.l, torch.float32, f"{what}.l")
    assert_close(got.o, want.o, dtype, f"{what}.o")


INTRA = [  # (Hq, Hkv, T, D, S): GQA 1/2/3, partial last chunk, S not a tile multiple, S > T, odd D
    (2, 2, 37, 16, 8),
    (4, 2, 50, 32, 16),
    (6, 2, 45, 24, 12),
    (3, 1, 20, 16, 32),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hkv,t,d,s", INTRA)
def test_intra_kernel_matches_twin(hq, hkv, t, d, s, dtype):
    q, k, v = (randn(h, t, d, dtype=dtype, device=DEVICE, seed=i) for i, h in enumerate((hq, hkv, hkv)))
    want = intra_attention(q, k, v, s, 0.3, use_kernel=False)
    got = intra_attention(q, k, v, s, 0.3, use_kernel=True)
    _state_close(got.state, want.state, dtype, "intra")
    assert got.state.o.dtype == dtype and got.state.m.dtype == torch.float32
    assert_close(got.colsum, want.colsum, torch.float32, "intra.colsum")
    # every real query's softmax sums to 1: column sums add up to T per head
    torch.testing.assert_close(got.colsum.sum(dim=1), torch.full((hq,), float(t), device=DEVICE))


@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 32)])
def test_intra_kernel_is_tile_independent(tiles):
    """Query blocks straddling chunks and chunks spanning several key blocks (S=24)."""
    q, k, v = (randn(h, 70, 16, dtype=torch.float32, device=DEVICE, seed=i) for i, h in enumerate((4, 2, 2)))
    want = intra_attention(q, k, v, 24, 0.25, use_kernel=False)
    got = flash_attention(q, k, v, 0.25, 24, with_colsum=True, tiles=tiles)
    _state_close(got.state, want.state, torch.float32, f"intra{tiles}")
    assert_close(got.colsum, want.colsum, torch.float32, f"intra{tiles}.colsum")


def test_kernels_read_strided_views():
    """Model layouts hand over [T, H, D] views transposed to [H, T, D]: no copy needed."""
    q = randn(40, 4, 16, dtype=torch.float32, device=DEVICE, seed=1).transpose(0, 1)
    k, v = (randn(40, 2, 16, dtype=torch.float32, device=DEVICE, seed=s).transpose(0, 1) for s in (2, 3))
    assert not q.is_contiguous()
    want = intra_attention(q.contiguous(), k.contiguous(), v.contiguous(), 16, 0.25, use_kernel=False)
    got = intra_attention(q, k, v, 16, 0.25, use_kernel=True)
    _state_close(got.state, want.state, torch.float32, "strided intra")
    assert_close(got.colsum, want.colsum, torch.float32, "strided intra.colsum")


INTER = [(4, 2, 8, 5), (6, 2, 21, 37), (2, 2, 16, 1), (8, 1, 5, 16)]  # (Hq, Hkv, T, M)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hkv,t,mem", INTER)
def test_inter_kernel_matches_twin(hq, hkv, t, mem, dtype):
    q = randn(hq, t, 16, dtype=dtype, device=DEVICE, seed=4)
    k_mem, v_mem = (randn(hkv, mem, 16, dtype=dtype, device=DEVICE, seed=s) for s in (5, 6))
    want = inter_attention(q, k_mem, v_mem, 0.25, use_kernel=False)
    got = inter_attention(q, k_mem, v_mem, 0.25, use_kernel=True)
    _state_close(got.state, want.state, dtype, "inter")
    assert_close(got.colsum, want.colsum, torch.float32, "inter.colsum")


def test_inter_kernel_large_logits_stay_finite():
    q = randn(4, 8, 16, dtype=torch.float16, device=DEVICE, seed=7, scale=12.0)
    k_mem, v_mem = (randn(2, 9, 16, dtype=torch.float16, device=DEVICE, seed=s, scale=3.0) for s in (8, 9))
    got = inter_attention(q, k_mem, v_mem, 1.0, use_kernel=True)
    assert float(got.state.m.abs().max()) > 100  # the case really has huge logits
    want = inter_attention(q, k_mem, v_mem, 1.0, use_kernel=False)
    _state_close(got.state, want.state, torch.float16, "inter +-100")
    assert bool(torch.isfinite(got.state.o).all() and torch.isfinite(got.colsum).all())


def test_inter_kernel_empty_memory_is_the_empty_state():
    q = randn(4, 8, 16, dtype=torch.float32, device=DEVICE)
    empty = torch.zeros(2, 0, 16, device=DEVICE)
    got = inter_attention(q, empty, empty, 0.25, use_kernel=True)
    assert bool(torch.isneginf(got.state.m).all()) and not bool(got.state.l.any()) and not bool(got.state.o.any())
    assert got.colsum.shape == (4, 0)


SCORING = [(2, 4, 6, 2, 50), (1, 1, 2, 2, 1), (3, 9, 4, 1, 37), (2, 3, 6, 3, 5)]  # (n_l, n_q, Hq, Hkv, P)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_l,n_q,hq,hkv,p", SCORING)
def test_scoring_kernel_matches_twin(n_l, n_q, hq, hkv, p, dtype):
    queries = randn(n_l, n_q, hq, 16, dtype=dtype, device=DEVICE, seed=10)
    keys = randn(n_l, hkv, p, 16, dtype=dtype, device=DEVICE, seed=11)
    got = attention_scores(queries, keys, 0.25, use_kernel=True)
    assert got.dtype == torch.float32
    assert_close(got, attention_scores(queries, keys, 0.25, use_kernel=False), torch.float32, "scoring")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("query_start", [0, 17, 44])
def test_scoring_kernel_masks_an_observation_window(query_start, dtype):
    """An observation window's queries (query q at position query_start + q sees the keys up to it)
    across key tiles: the twin's causal mask, zeros where unseen; query_start P - 1 masks nothing."""
    queries = randn(2, 6, 4, 16, dtype=dtype, device=DEVICE, seed=14)
    keys = randn(2, 2, 45, 16, dtype=dtype, device=DEVICE, seed=15)
    got = scoring_softmax(queries, keys, 0.25, block_keys=16, query_start=query_start)
    want = attention_scores(queries, keys, 0.25, use_kernel=False, query_start=query_start)
    assert_close(got, want, torch.float32, "scoring, observation window")
    seen = torch.arange(45, device=got.device)[None, :] <= query_start + torch.arange(6, device=got.device)[:, None]
    assert not bool(got.masked_select(~seen[:, None, None, :].expand_as(got)).any())
    assert_close(attention_scores(queries, keys, 0.25, use_kernel=True, query_start=query_start), want,
                 torch.float32, "the stage takes the kernel")  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("query_start", [0, 20, 44, None])
@pytest.mark.parametrize("split_keys", [16, 32])
def test_scoring_kernel_splits_the_keys_among_programs(split_keys, query_start, dtype):
    """The keys shared out in ranges of split_keys (3 or 2 ranges of 45 keys, the last one short): each
    range's (max, sum) merged on the host is the whole row's softmax, the twin's to its tolerance; an
    observation window's early queries see no key of the later ranges (max -inf, sum 0 there), which
    leaves zeros and no NaN."""
    queries = randn(2, 6, 4, 16, dtype=dtype, device=DEVICE, seed=16)
    keys = randn(2, 2, 45, 16, dtype=dtype, device=DEVICE, seed=17)
    got = scoring_softmax(queries, keys, 0.25, block_keys=16, query_start=query_start, split_keys=split_keys)
    want = attention_scores(queries, keys, 0.25, use_kernel=False, query_start=query_start)
    assert bool(torch.isfinite(got).all())
    assert_close(got, want, torch.float32, "scoring, split keys")
    assert_close(got.sum(-1), torch.ones_like(got[..., 0]), torch.float32, "each row sums to 1")


def test_scoring_kernel_takes_only_whole_tiles_per_range():
    queries = randn(1, 2, 2, 16, dtype=torch.float32, device=DEVICE, seed=18)
    keys = randn(1, 1, 40, 16, dtype=torch.float32, device=DEVICE, seed=19)
    with pytest.raises(ValueError, match="no multiple of the 16-key tile"):
        scoring_softmax(queries, keys, 0.25, block_keys=16, split_keys=24)


def test_scoring_kernel_reads_a_cache_slice_across_key_tiles():
    """Keys as a view of a larger cache ([n_l, Hkv, capacity, D] sliced to P), several rows blocks."""
    cache = randn(2, 2, 64, 24, dtype=torch.float32, device=DEVICE, seed=12)
    keys = cache[:, :, :45]
    queries = randn(2, 9, 16, 24, dtype=torch.float32, device=DEVICE, seed=13)  # G*n_q = 72 rows
    want = attention_scores(queries, keys.contiguous(), 0.2, use_kernel=False)
    assert_close(scoring_softmax(queries, keys, 0.2, block_keys=16), want, torch.float32, "scoring")
    assert_close(scoring_softmax(queries, keys, 0.2, block_keys=16, split_keys=32), want, torch.float32, "ranges")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_h2o_layer_with_kernels_matches_twins(dtype):
    q = randn(4, 45, 16, dtype=dtype, device=DEVICE, seed=14)
    k, v = (randn(2, 45, 16, dtype=dtype, device=DEVICE, seed=s) for s in (15, 16))
    config = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=4, dense_tail=0)
    want = h2o_layer(q, k, v, config, 0.25, use_kernels=False)
    got = h2o_layer(q, k, v, config, 0.25, use_kernels=True)
    assert len(got.memory_sets) == 2
    assert all(torch.equal(a.indices, b.indices) for a, b in zip(got.memory_sets, want.memory_sets))
    assert_close(got.output, want.output, dtype, "layer output")
    assert_close(got.scores, want.scores, torch.float32, "layer scores")


@pytest.mark.parametrize("n,local,heavy", [(40, 0, 0), (16, 3, 4)])
def test_h2o_layer_that_is_plain_causal_with_kernels(n, local, heavy):
    """H2O disabled (L+H=0) and a prompt within one chunk: plain causal attention."""
    q = randn(4, n, 16, dtype=torch.float32, device=DEVICE, seed=19)
    k, v = (randn(2, n, 16, dtype=torch.float32, device=DEVICE, seed=s) for s in (20, 21))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecfillWarning)
        config = H2OConfig(chunk_size=16, batch_size=32, local=local, heavy=heavy, dense_tail=0)
    got = h2o_layer(q, k, v, config, 0.25, use_kernels=True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    assert_close(got.output, want, torch.float32, "causal output")
    assert got.memory_sets == []


def test_speculative_importance_with_kernels_matches_twins():
    queries = randn(3, 4, 4, 16, dtype=torch.float32, device=DEVICE, seed=17)
    keys = randn(3, 2, 70, 16, dtype=torch.float32, device=DEVICE, seed=18)
    config = SpecPrefillConfig(keep_ratio=0.3, select_chunk=8, layers="last-2")
    got = importance(queries, keys, config, 0.25, use_kernels=True)
    want = importance(queries, keys, config, 0.25, use_kernels=False)
    assert_close(got, want, torch.float32, "importance")


# (Hq, Hkv, T, S, D, tiles): a prompt's first step (S = T, causal) and later steps (S > T), GQA 1/2/3/4,
# T and S not tile multiples, an odd head size (masked D), one query, and forced tiles whose unmasked
# walk covers several key tiles before the band (BLOCK_N < start)
PREFILL = [
    (4, 2, 37, 37, 16, None),
    (6, 2, 45, 100, 24, None),
    (3, 1, 33, 33, 64, (32, 16)),
    (2, 2, 5, 90, 32, (16, 32)),
    (4, 1, 1, 50, 16, None),
    (8, 2, 40, 71, 16, (16, 16)),
]


# (tma, wide) per case: the pointer kernel, the TMA kernel, and its wide tiles; the interpreter runs its own
# small tiles, where wide is the TMA kernel again: there one case checks the flag's way through
PREFILL_KERNELS = [
    pytest.param(*case, tma, wide, id=f"{name}-{index}")
    for index, case in enumerate(PREFILL)
    for name, tma, wide in (("pointers", False, False), ("tma", True, False), ("wide", True, True))
    if not (wide and DEVICE == "cpu" and index > 0)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hkv,t,s,d,tiles,tma,wide", PREFILL_KERNELS)
def test_prefill_kernel_matches_float32_attention(hq, hkv, t, s, d, tiles, tma, wide, dtype):
    """The Triton prefill kernels (the attention probe's "triton", "triton-tma" and "triton-tma-wide"
    candidates) against float32 attention with an explicit lower-right causal mask and expanded heads,
    on q / k / v as a layer hands them over ([1, H, T, D] views of [1, T, H, D] projections). The TMA
    kernel takes power-of-2 heads only (a clear error otherwise) and, on a GPU, sm_90 or later; its
    wide tiles there 16-bit heads up to 128 only (the interpreter runs its own small tiles)."""
    from specfill.backends.torch_cuda.attention_choice import reference
    from specfill.backends.torch_cuda.kernels.prefill_triton import prefill_attention

    if tma and DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need sm_90 or later")
    q = randn(1, t, hq, d, dtype=dtype, device=DEVICE, seed=40).transpose(1, 2)
    k, v = (randn(1, s, hkv, d, dtype=dtype, device=DEVICE, seed=seed).transpose(1, 2) for seed in (41, 42))
    if tma and d & (d - 1):
        with pytest.raises(ValueError, match="power-of-2 heads"):
            prefill_attention(q, k, v, 0.3, tiles=tiles, tma=True, wide=wide)
        return
    if wide and DEVICE == "cuda" and (dtype == torch.float32 or d > 128):
        with pytest.raises(ValueError, match="wide prefill tiles"):
            prefill_attention(q, k, v, 0.3, tiles=tiles, tma=True, wide=True)
        return
    got = prefill_attention(q, k, v, 0.3, tiles=tiles, tma=tma, wide=wide)
    assert got.dtype == dtype and got.shape == (1, hq, t, d)
    assert_close(got, reference(q, k, v, s - t, 0.3).to(dtype), dtype, "prefill")


def test_prefill_kernel_takes_only_a_positive_scale():
    """The tile scales the raw scores' row maxima (prefill_triton._tile), which only a positive scale
    commutes with: any other is refused, never computed wrong."""
    from specfill.backends.torch_cuda.kernels.prefill_triton import prefill_attention

    q = randn(1, 2, 4, 16, dtype=torch.float32, device=DEVICE, seed=43)
    k = randn(1, 2, 6, 16, dtype=torch.float32, device=DEVICE, seed=44)
    for scale in (0.0, -0.3):
        with pytest.raises(ValueError, match="positive scale"):
            prefill_attention(q, k, k, scale)


@pytest.mark.parametrize("kind", ["causal", "prefix"])
def test_the_attention_probe_runs_the_triton_candidate(kind):
    """The probe's "triton" candidate (attention_choice._triton_prefill) through the probe itself: checked
    against its float32 reference and timed, on the device this file runs on."""
    from specfill.backends.torch_cuda import attention_choice as choice

    kernels = {"triton": choice.candidates(kind)["triton"]}
    if DEVICE == "cpu" or torch.cuda.get_device_capability()[0] >= 9:
        kernels["triton-tma"] = choice._triton_prefill_tma
        kernels["triton-tma-wide"] = choice._triton_prefill_tma_wide
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    name, _, report = choice.probe(kind, 4, 2, 16, dtype, torch.device(DEVICE), kernels, queries=24, prefix=40)
    assert name in kernels and all(report[each].endswith(" ms") for each in kernels), report


def _math_halves(q, k, v, causal, scale):
    """A stand-in for the raw fused call (cuDNN's has no CPU kernel): output and float32 log-sum-exp."""
    from specfill.backends.torch_cuda import attention_choice as choice

    k2, v2 = choice._expand(q, k, v)
    logits = (q.float() @ k2.float().transpose(-1, -2)) * scale
    if causal:
        logits = logits.masked_fill(torch.ones_like(logits, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(logits, -1) @ v2.float()).to(q.dtype), torch.logsumexp(logits, -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["sequence-major", "head-major"])
def test_lse_merge_kernel_is_the_torch_merge(layout, dtype):
    """The one-pass merge (kernels/merge_triton.py) against attention_choice's torch merge: halves as a
    fused call returns them ([1, H, T, D] views of [1, T, H, D], or contiguous), log-sum-exps far apart
    and close, a row no key reaches (both -inf) 0 and not NaN; the output a view of [1, T, H, D]."""
    from specfill.backends.torch_cuda import attention_choice as choice
    from specfill.backends.torch_cuda.kernels.merge_triton import lse_merge

    heads, rows, d = 3, 70, 24
    if layout == "sequence-major":
        out_p, out_c = (randn(1, rows, heads, d, dtype=dtype, device=DEVICE, seed=s).transpose(1, 2) for s in (80, 81))
    else:
        out_p, out_c = (randn(1, heads, rows, d, dtype=dtype, device=DEVICE, seed=s) for s in (80, 81))
    lse_p = randn(1, heads, rows, dtype=torch.float32, device=DEVICE, seed=82, scale=6.0)
    lse_c = randn(1, heads, rows, dtype=torch.float32, device=DEVICE, seed=83, scale=6.0)
    got = lse_merge(out_p, out_c, lse_p, lse_c)
    assert got.dtype == dtype and got.shape == (1, heads, rows, d) and got.transpose(1, 2).is_contiguous()
    assert_close(got, choice._torch_merge(out_p, out_c, lse_p, lse_c), dtype, "lse merge")
    lse_p[0, 1, 5] = lse_c[0, 1, 5] = float("-inf")
    blank = lse_merge(out_p, out_c, lse_p, lse_c)
    assert torch.isfinite(blank.float()).all() and torch.equal(
        blank[0, 1, 5].float().abs().sum().cpu(), torch.tensor(0.0)
    )


def test_lse_merge_kernel_refuses_halves_it_cannot_take():
    """One clear error: halves of two shapes, or a strided head dimension."""
    from specfill.backends.torch_cuda.kernels.merge_triton import lse_merge

    out = randn(1, 2, 5, 16, dtype=torch.float32, device=DEVICE, seed=84)
    lse = randn(1, 2, 5, dtype=torch.float32, device=DEVICE, seed=85)
    with pytest.raises(ValueError, match="lse_merge kernel"):
        lse_merge(out, out[:, :, :4], lse, lse)
    with pytest.raises(ValueError, match="lse_merge kernel"):
        wide = randn(1, 2, 16, dtype=torch.float32, device=DEVICE, seed=85)
        lse_merge(out.transpose(2, 3), out.transpose(2, 3), wide, wide)


def test_the_split_candidate_with_the_merge_kernel_is_attention():
    """The probe's "split-cudnn-triton-merge" candidate: on a GPU cuDNN's halves through the probe itself
    (checked against float32 attention and timed); in the interpreter the split with a float32 stand-in
    for cuDNN's raw call, against float32 attention with an explicit lower-right mask."""
    from specfill.backends.torch_cuda import attention_choice as choice

    if DEVICE == "cuda":
        kernels = {"split-cudnn-triton-merge": choice.candidates("prefix")["split-cudnn-triton-merge"]}
        name, _, report = choice.probe(
            "prefix", 4, 2, 64, torch.float16, torch.device(DEVICE), kernels, queries=256, prefix=512
        )
        assert name in kernels and report[name].endswith(" ms"), report
        return
    q = randn(1, 4, 9, 16, dtype=torch.float32, device=DEVICE, seed=86)
    k, v = (randn(1, 2, 30, 16, dtype=torch.float32, device=DEVICE, seed=s) for s in (87, 88))
    got = choice._split(_math_halves, choice._triton_merge)(q, k, v, 21, 0.25)
    assert_close(got, choice.reference(q, k, v, 21, 0.25), torch.float32, "split with the merge kernel")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("filled,bucket", [(300, 640), (1000, 1024), (77, 96)])
def test_eager_decode_attention_is_the_replayed_steps_bitwise(filled, bucket, dtype, monkeypatch):
    """attention.one_query_cuda (the eager decode's attention on a GPU) over the filled slots gives bitwise
    what a static decode step's call gives over its bucket (decode_graph._MaskedAttention: the tail hidden by
    the bias, its slots holding stale values): the same kernel and split plan, the hidden slots adding exact
    zeros. With the split-key kernel forced (the interpreter; the GPU's probe may choose it) and, on a GPU,
    with whatever the probe chose."""
    from specfill.backends.torch_cuda import attention_choice as choice
    from specfill.backends.torch_cuda.attention import one_query_cuda

    if DEVICE == "cpu":  # off CUDA decode_kernel answers SDPA: force the Triton kernel, as a GPU's probe may
        monkeypatch.setattr(choice, "decode_kernel", lambda name, q, k, v=None: choice.split_decode)
    n_heads, n_kv, d = 6, 2, 32
    q = randn(1, 1, n_heads, d, dtype=dtype, device=DEVICE, seed=90).transpose(1, 2)
    cache_k, cache_v = (randn(1, n_kv, bucket, d, dtype=dtype, device=DEVICE, seed=s, scale=2.0) for s in (91, 92))
    folded = q.reshape(n_kv, n_heads // n_kv, d)
    seen = torch.arange(bucket, device=DEVICE) < filled
    bias = torch.zeros((n_heads // n_kv, bucket), dtype=dtype, device=DEVICE).masked_fill_(~seen, float("-inf"))
    kernel = choice.decode_kernel("auto", folded, cache_k[0])
    replayed = kernel(folded, cache_k[0], cache_v[0], bias, 0.3).reshape(1, n_heads, 1, d)
    eager = one_query_cuda(q, cache_k[:, :, :filled], cache_v[:, :, :filled], 0.3)
    assert eager.dtype == dtype and eager.shape == (1, n_heads, 1, d)
    assert torch.equal(eager, replayed)
    want = choice.reference(q, cache_k[:, :, :filled], cache_v[:, :, :filled], filled - 1, 0.3)
    assert_close(eager, want.to(dtype), dtype, "one query")


# (Hkv, R, N, D, keys per split): several splits with a partial last one; a verify step's GQA rows; one split
DECODE = [
    (2, 4, 100, 16, 32),
    (3, 20, 77, 24, 16),
    (1, 2, 40, 16, None),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hkv,rows,n,d,split", DECODE)
def test_decode_kernel_matches_sdpa(hkv, rows, n, d, split, dtype):
    """The split-key decode kernel against float32 SDPA with the same additive mask; keys and
    values as the static step hands them over (a bucket sliced from a larger cache), and a row
    that sees no key comes out 0, not NaN."""
    from specfill.backends.torch_cuda.kernels.decode_triton import decode_attention

    q = randn(hkv, rows, d, dtype=dtype, device=DEVICE, seed=30)
    cache_k, cache_v = (randn(hkv, n + 9, d, dtype=dtype, device=DEVICE, seed=s) for s in (31, 32))
    k, v = cache_k[:, :n], cache_v[:, :n]
    generator = torch.Generator().manual_seed(33)
    last = torch.randint(0, n, (rows,), generator=generator).to(DEVICE)
    seen = torch.arange(n, device=DEVICE)[None, :] <= last[:, None]
    seen[-1] = False
    bias = torch.zeros(rows, n, dtype=dtype, device=DEVICE).masked_fill_(~seen, float("-inf"))
    got = decode_attention(q, k, v, bias, 0.3, split_keys=split)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float()[None], k.float()[None], v.float()[None], attn_mask=bias.float()[None, None], scale=0.3
    )[0]
    assert got.dtype == dtype and got.shape == (hkv, rows, d)
    assert_close(got[:, :-1], want[:, :-1].to(dtype), dtype, "decode")
    assert bool((got[:, -1] == 0).all())


def test_static_decode_steps_through_the_split_kernel_give_the_eager_tokens(monkeypatch):
    """decode_graph's static steps with the split-key kernel forced: the eager path's greedy tokens,
    across buckets (a 16-slot bucket here)."""
    from specfill.backends.torch_cuda import decode_graph
    from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
    from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

    monkeypatch.setattr(decode_graph, "SLOT_BUCKET", 16)
    tiny = make_tiny("llama")
    ids = prompt_ids(12)  # 7 decode steps: slots 12-18, buckets of 16 and 32 slots

    def greedy(model):
        steps = model.generate_step(
            ids, max_tokens=8, sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod(),
            info=GenerationInfo(),
        )  # fmt: skip
        return list(steps)

    expected = greedy(tiny.ours(device=DEVICE))  # the kernel's device (a GPU's Triton takes no CPU tensor)
    model = tiny.ours(device=DEVICE)
    model.ops.static_decode = True
    model.ops.decode_graphs = decode_graph.DecodeGraphs(None, attention="split-triton")
    assert greedy(model) == expected


# the slow groups in the interpreter run float32 only there (on a GPU every group runs in every dtype):
# the whole H2O layers (h2o.layer, h2o.prefix_layer, and the composed speculator's layers), whose
# fp16 kernels test_h2o_layer_with_kernels_matches_twins covers; and specprefill.reuse, whose fp16
# kernel (scoring) specprefill.attention_scores and specprefill.selection run here in fp16, its
# reuse-specific selection running in float32 here and in fp16 on the twins (tests/test_conformance.py)
SLOW_IN_INTERPRETER = ("h2o.layer", "h2o.prefix_layer", "specprefill.composed", "specprefill.reuse")
CONFORMANCE = [
    (group, dtype)
    for group in CHECK_GROUPS
    for dtype in ("float32", "float16", *GPU_DTYPES)
    if not (group in SLOW_IN_INTERPRETER and dtype == "float16" and DEVICE == "cpu")
]


@pytest.mark.parametrize("group,dtype", CONFORMANCE)
def test_conformance_with_kernels_forced(group, dtype):
    from specfill.backends.torch_cuda.conformance import make_adapter

    results = run_group(make_adapter(dtype=dtype, use_kernels=True, device=DEVICE), dtype, group)
    failures = [r for r in results if not r.passed]
    assert results and not failures, "\n".join(f"{r.check} [{r.case}]: {r.detail}" for r in failures[:10])
