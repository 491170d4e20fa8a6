"""Triton split-key attention for decode steps (flash-decoding): a few query rows over many keys.

A decode step's attention has a few rows per KV head (the G grouped query heads times the step's
T tokens, folded: decode_graph.py) and thousands of keys. One fused-attention program per KV head,
as SDPA's kernels launch for so few rows, leaves most of a GPU idle while it streams the cache:
8 programs for an 8B model's 8 KV heads. Here the keys are cut into splits and every
(KV head, split) program runs the online softmax over its split for all the head's rows
(`_split_kernel`: partial outputs, maxima and sums in float32), then one program per
(KV head, row) merges the splits by their maxima (`_merge_kernel`), so the cache is read once, by
Hkv x splits programs.

Masking is the step's additive bias [R, N] (0 where a row sees a key, -inf elsewhere; one bias for
every head, as the static step builds it). A split that a row sees nothing of contributes a zero
weight, and a row that sees no key at all comes out 0, never NaN.

Imported lazily (backends/torch_cuda/attention_choice.py): Triton decides at decoration time
whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import dot_tile, interpreting, next_power_of_2
from .state import LOG2E

SPLIT_KEYS = 256  # keys per split on a GPU: an 8K-slot bucket is 32 splits x 8 KV heads = 256 programs
MAX_SPLITS = 128  # longer caches get longer splits (the merge reads every split's maxima at once)


def gpu_tiles(dtype: torch.dtype) -> tuple[int, int, int]:
    """(keys per tile, warps, pipeline stages) of the split kernel on a GPU: 32 keys for 16-bit
    inputs, 16 for float32, 8 warps, 2 stages. Compiled ahead of time for sm_80 / 89 / 90, head
    sizes 64 / 128 / 256 and 4 / 36 folded rows (one block of rows, and two), these spill no
    register and fit shared memory everywhere, where 64-key tiles with 4 warps spilled with 36 rows
    or 256-wide heads (kernels/aot.py compile_decode, tests/torch_cuda_kernels/test_aot.py)."""
    return (16 if dtype == torch.float32 else 32), 8, 2


def row_block(rows: int) -> int:
    """Query rows per split program: all of a plain decode step's (G <= 16 for every listed model),
    at most 32 (a long verify step's rows take several programs, each reading the split again)."""
    return max(16, min(32, next_power_of_2(rows)))


MERGE_SPLITS_PER_STEP = 16  # splits whose partial outputs the merge reads at once


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    Bias,
    O,
    M,
    L,
    stride_qh,
    stride_qr,
    stride_qd,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_br,
    stride_bn,
    stride_oh,
    stride_os,
    stride_or,
    stride_od,
    stride_mh,
    stride_ms,
    n_rows,
    n_keys,
    head_dim,
    value_dim,
    split_keys,
    qk_scale,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    head = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < value_dim
    q = tl.load(
        Q + head * stride_qh + rows[:, None] * stride_qr + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    begin = split * split_keys
    end = tl.minimum(begin + split_keys, n_keys)
    for start in range(begin, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        key_ok = offs_n < end
        k = tl.load(
            K + head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            mask=key_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        bias = tl.load(
            Bias + rows[:, None] * stride_br + offs_n[None, :] * stride_bn,
            mask=row_ok[:, None] & key_ok[None, :],
            other=float("-inf"),
        ).to(tl.float32)
        # base-2 logits: the bias's 0 stays 0 and its -inf stays -inf once scaled
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale + bias * 1.4426950408889634
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet: weights 0
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + head * stride_vh + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
            mask=key_ok[:, None] & dv_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    tl.store(
        O + head * stride_oh + split * stride_os + rows[:, None] * stride_or + offs_dv[None, :] * stride_od,
        acc,
        mask=row_ok[:, None] & dv_ok[None, :],
    )
    tl.store(M + head * stride_mh + split * stride_ms + rows, m_i, mask=row_ok)
    tl.store(L + head * stride_mh + split * stride_ms + rows, l_i, mask=row_ok)


@triton.jit
def _merge_kernel(
    O,
    M,
    L,
    Out,
    stride_oh,
    stride_os,
    stride_or,
    stride_od,
    stride_mh,
    stride_ms,
    stride_xh,
    stride_xr,
    stride_xd,
    n_splits,
    value_dim,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    SPLITS_PER_STEP: tl.constexpr,
):
    head = tl.program_id(0)
    row = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < n_splits
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < value_dim
    m = tl.load(M + head * stride_mh + splits * stride_ms + row, mask=s_ok, other=float("-inf"))
    l = tl.load(L + head * stride_mh + splits * stride_ms + row, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    total = tl.sum(tl.exp2(m - m_safe) * l, 0)  # a split the row saw nothing of weighs 0
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for first in range(0, n_splits, SPLITS_PER_STEP):  # a few splits' outputs at a time: few registers
        part = first + tl.arange(0, SPLITS_PER_STEP)
        part_ok = part < n_splits
        weight = tl.exp2(
            tl.load(M + head * stride_mh + part * stride_ms + row, mask=part_ok, other=float("-inf")) - m_safe
        )
        o = tl.load(
            O + head * stride_oh + part[:, None] * stride_os + row * stride_or + offs_dv[None, :] * stride_od,
            mask=part_ok[:, None] & dv_ok[None, :],
            other=0.0,
        )
        acc += tl.sum(o * weight[:, None], 0)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(Out + head * stride_xh + row * stride_xr + offs_dv * stride_xd, out, mask=dv_ok)


def split_plan(n_keys: int, block_n: int, split_keys: int | None = None) -> tuple[int, int]:
    """(keys per split, splits): SPLIT_KEYS keys (a multiple of block_n), longer where more than
    MAX_SPLITS splits would be needed; split_keys overrides the first (tests)."""
    if split_keys is None:
        split_keys = max(SPLIT_KEYS, -(-n_keys // MAX_SPLITS))
    split_keys = -(-split_keys // block_n) * block_n
    return split_keys, max(1, -(-n_keys // split_keys))


def compiled_variant(n_keys: int, n_rows: int, value_dim: int, dtype: torch.dtype) -> tuple:
    """What decode_attention of n_rows folded rows over n_keys keys compiles anew for, beyond the model's
    fixed shapes: the merge's BLOCK_S (from the split count), and, for every integer argument that follows
    n_keys (the key count, the split length and count, the partial results' strides), the two facts Triton
    specialises an integer on: a multiple of 16, equal to 1. A capture whose launch needs a variant not
    yet compiled would compile inside it (decode_graph.DecodeGraphs captures a step first only where the
    process has compiled its variant)."""
    split_keys, n_splits = split_plan(n_keys, gpu_tiles(dtype)[0])
    ints = (n_keys, split_keys, n_splits, n_splits * n_rows * value_dim, n_splits * n_rows)
    return max(16, next_power_of_2(n_splits)), tuple((v % 16 == 0, v == 1) for v in ints)


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    split_keys: int | None = None,
) -> torch.Tensor:
    """q [Hkv, R, D] (each KV head's folded query rows), k [Hkv, N, D], v [Hkv, N, Dv], bias [R, N]
    (additive: 0 seen, -inf hidden; any strides) -> [Hkv, R, Dv] in q's dtype, float32 statistics.
    split_keys: keys per split (tests; default split_plan's)."""
    n_kv, n_rows, head_dim = q.shape
    n_keys, value_dim = k.shape[1], v.shape[2]
    block_n, warps, stages = gpu_tiles(q.dtype)
    if interpreting():
        block_n = dot_tile(n_keys, 32)
    split_keys, n_splits = split_plan(n_keys, block_n, split_keys)
    block_r = row_block(n_rows)
    block_d, block_dv = max(16, next_power_of_2(head_dim)), max(16, next_power_of_2(value_dim))
    partial = torch.empty((n_kv, n_splits, n_rows, value_dim), dtype=torch.float32, device=q.device)
    maxima = torch.empty((n_kv, n_splits, n_rows), dtype=torch.float32, device=q.device)
    sums = torch.empty_like(maxima)
    options = {} if interpreting() else {"num_warps": warps, "num_stages": stages}
    _split_kernel[(n_kv, n_splits, triton.cdiv(n_rows, block_r))](
        q,
        k,
        v,
        bias,
        partial,
        maxima,
        sums,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *bias.stride(),
        *partial.stride(),
        maxima.stride(0),
        maxima.stride(1),
        n_rows,
        n_keys,
        head_dim,
        value_dim,
        split_keys,
        float(scale) * LOG2E,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        **options,
    )
    out = torch.empty((n_kv, n_rows, value_dim), dtype=q.dtype, device=q.device)
    _merge_kernel[(n_kv, n_rows)](
        partial,
        maxima,
        sums,
        out,
        *partial.stride(),
        maxima.stride(0),
        maxima.stride(1),
        *out.stride(),
        n_splits,
        value_dim,
        BLOCK_S=max(16, next_power_of_2(n_splits)),
        BLOCK_DV=block_dv,
        SPLITS_PER_STEP=MERGE_SPLITS_PER_STEP,
        **({} if interpreting() else {"num_warps": 4}),
    )
    return out
