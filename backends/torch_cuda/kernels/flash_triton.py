"""Triton kernels behind the intra (phase 1) and inter (phase 2) stages.

Two kernels, one per pass:
  1. `_forward_kernel`: FlashAttention-style online softmax per block of queries; writes the
     row statistics (m in log2 units, l) and the normalised output.
  2. `_colsum_kernel`: per block of keys, walks the queries that can see them, recomputes
     p = exp2(s - m) / l with the FINAL row statistics and sums it over the queries. A second
     pass (rather than atomics in the first) keeps the column sums deterministic.
BLOCK_DIAGONAL selects the phase-1 mask (key j visible to query i iff same chunk and j <= i);
without it every key is visible (phase 2). Query head h reads KV head h // GROUP through
pointer arithmetic: K/V are never repeated in memory.

Imported lazily by the dispatchers: Triton decides at decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specfill.core.stages import AttentionState, IntraResult

from .dispatch import device_arch, dot_tile, interpreting, next_power_of_2
from .state import LN2, LOG2E
from .tiles import flash_tiles


@triton.jit
def _block_diagonal(offs_m, offs_n, chunk_size):
    """The phase-1 mask [BLOCK_M, BLOCK_N]: key j visible to query i iff same chunk and j <= i."""
    return (offs_n[None, :] <= offs_m[:, None]) & ((offs_n[None, :] // chunk_size) == (offs_m[:, None] // chunk_size))


@triton.jit
def _program(head_dim, BLOCK_D: tl.constexpr):
    """Both kernels' prologue: the program's (block, query head) and the head dim's offsets and mask."""
    offs_d = tl.arange(0, BLOCK_D)
    return tl.program_id(0), tl.program_id(1), offs_d, offs_d < head_dim


@triton.jit
def _rows(base, stride_t, first, n_rows, d_ok, BLOCK: tl.constexpr):
    """Rows [first, first + BLOCK) of one head's [n_rows, D] tensor, `base` its pointer with the d
    offsets added; zero past n_rows and where d_ok is False: (row offsets, row mask, tile)."""
    offs = first + tl.arange(0, BLOCK)
    ok = offs < n_rows
    return offs, ok, tl.load(base + offs[:, None] * stride_t, mask=ok[:, None] & d_ok[None, :], other=0.0)


# The two kernels' arguments (their order is the launch's; aot.py reads their names), grouped: the
# tensors, their (head, row, dim) strides, what is computed (sizes, scale, mask), how (precision, tiles).
@triton.jit
def _forward_kernel(
    Q, K, V, O, M, L,
    stride_qh, stride_qt, stride_qd, stride_kh, stride_kt, stride_kd,
    stride_vh, stride_vt, stride_vd, stride_oh, stride_ot, stride_od,
    n_queries, n_keys, head_dim, chunk_size, group, qk_scale, BLOCK_DIAGONAL: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    block, head, offs_d, d_ok = _program(head_dim, BLOCK_D)
    q_base = Q + head * stride_qh + offs_d[None, :] * stride_qd
    offs_m, row_ok, q = _rows(q_base, stride_qt, block * BLOCK_M, n_queries, d_ok, BLOCK_M)
    kv_head = head // group
    k_base = K + kv_head * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + kv_head * stride_vh + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if BLOCK_DIAGONAL:
        # keys from the chunk start of the block's first query up to its last query
        lo = (block * BLOCK_M // chunk_size) * chunk_size
        hi = tl.minimum(block * BLOCK_M + BLOCK_M, n_keys)
    else:
        lo = 0
        hi = n_keys
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, key_ok, k = _rows(k_base, stride_kt, start_n, n_keys, d_ok, BLOCK_N)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = key_ok[None, :]
        if BLOCK_DIAGONAL:
            visible = visible & _block_diagonal(offs_m, offs_n, chunk_size)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vt, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(
        O + head * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
        out.to(O.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    tl.store(M + head * n_queries + offs_m, m_i, mask=row_ok)
    tl.store(L + head * n_queries + offs_m, l_i, mask=row_ok)


@triton.jit
def _colsum_kernel(
    Q, K, M, L, CS,
    stride_qh, stride_qt, stride_qd, stride_kh, stride_kt, stride_kd,
    n_queries, n_keys, head_dim, chunk_size, group, qk_scale, BLOCK_DIAGONAL: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    block, head, offs_d, d_ok = _program(head_dim, BLOCK_D)
    k_base = K + (head // group) * stride_kh + offs_d[None, :] * stride_kd
    offs_n, key_ok, k = _rows(k_base, stride_kt, block * BLOCK_N, n_keys, d_ok, BLOCK_N)
    q_base = Q + head * stride_qh + offs_d[None, :] * stride_qd

    colsum = tl.zeros([BLOCK_N], tl.float32)
    if BLOCK_DIAGONAL:
        # queries from the block's first key to the end of its last key's chunk
        lo = block * BLOCK_N
        last_key = tl.minimum(block * BLOCK_N + BLOCK_N, n_keys) - 1
        hi = tl.minimum((last_key // chunk_size + 1) * chunk_size, n_queries)
    else:
        lo = 0
        hi = n_queries
    for start_m in range(lo, hi, BLOCK_M):
        offs_m, row_ok, q = _rows(q_base, stride_qt, start_m, n_queries, d_ok, BLOCK_M)
        m = tl.load(M + head * n_queries + offs_m, mask=row_ok, other=0.0)
        l = tl.load(L + head * n_queries + offs_m, mask=row_ok, other=1.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = row_ok[:, None] & key_ok[None, :]
        if BLOCK_DIAGONAL:
            visible = visible & _block_diagonal(offs_m, offs_n, chunk_size)
        l_safe = tl.where(l > 0, l, 1.0)
        p = tl.exp2(tl.where(visible, s - m[:, None], float("-inf"))) / l_safe[:, None]
        colsum += tl.sum(p, 0)
    tl.store(CS + head * n_keys + offs_n, colsum, mask=key_ok)


def _launch_config(
    n_queries: int, n_keys: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> tuple[int, int, int, dict[str, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, launch options). The interpreter runs one tile at a time in
    NumPy, so small problems get small tiles there; every dot dimension stays >= 16. On a GPU
    the tiles come from the device's architecture (tiles.py), each compiled ahead of time for
    every listed target without spills or over-sized shared memory (scripts/aot_matrix.py)."""
    block_d = max(16, next_power_of_2(head_dim))
    if interpreting():
        return dot_tile(n_queries, 32), dot_tile(n_keys, 32), block_d, {}
    tiles = flash_tiles(block_d, dtype, device_arch(device))
    return tiles.block_m, tiles.block_n, block_d, {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not silently drop to TF32 (10-bit mantissa) on tensor cores
    return "ieee" if dtype == torch.float32 else "tf32"


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    chunk_size: int | None,
    with_colsum: bool,
    tiles: tuple[int, int] | None = None,
) -> IntraResult:
    """q [Hq, T, D], k/v [Hkv, K, D] (any strides) -> state and column sums [Hq, K].

    chunk_size None: every key visible (K may differ from T); otherwise block-diagonal causal
    over chunks of chunk_size (K == T). tiles overrides (BLOCK_M, BLOCK_N) for tests.
    """
    n_heads, n_queries, head_dim = q.shape
    n_kv, n_keys = k.shape[0], k.shape[1]
    block_m, block_n, block_d, options = _launch_config(n_queries, n_keys, head_dim, q.dtype, q.device)
    if tiles is not None:
        block_m, block_n = tiles
    o = torch.empty((n_heads, n_queries, head_dim), dtype=q.dtype, device=q.device)
    m = torch.empty((n_heads, n_queries), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    common = dict(
        n_queries=n_queries,
        n_keys=n_keys,
        head_dim=head_dim,
        chunk_size=chunk_size or 1,
        group=n_heads // n_kv,
        qk_scale=float(scale) * LOG2E,
        BLOCK_DIAGONAL=chunk_size is not None,
        PRECISION=_precision(q.dtype),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        **options,
    )
    _forward_kernel[(triton.cdiv(n_queries, block_m), n_heads)](
        q, k, v, o, m, l, *q.stride(), *k.stride(), *v.stride(), *o.stride(), **common
    )
    colsum = None
    if with_colsum:
        colsum = torch.empty((n_heads, n_keys), dtype=torch.float32, device=q.device)
        _colsum_kernel[(triton.cdiv(n_keys, block_n), n_heads)](q, k, m, l, colsum, *q.stride(), *k.stride(), **common)
    return IntraResult(AttentionState(m.mul_(LN2), l, o), colsum)
