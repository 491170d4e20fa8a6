"""Triton kernel behind speculative-prefill scoring.

A program per (scoring layer and KV head, block of rows, range of SPLIT_KEYS keys): its rows are the
n_q scoring queries of each of the G query heads that read this KV head (at most 64 per program), so
a key block is loaded once for all of them, and the prompt's keys are shared out among programs as
flash-decoding shares a decode step's (one program per layer and KV head walked 131K keys twice at a
128K prompt on an H200: 8 programs for 132 SMs, 2.6 ms a layer, 2026-12-04). Two launches of the one
kernel: STATS writes each range's row max and sum (online softmax), the host merges them over the
ranges, and the second recomputes the logits and writes exp2(s - m) / l. Query q sits at position
query_start + q and sees the keys at or before it (an observation window's causal mask; with
query_start = P - 1, the last prompt token and the look-ahead, every key); key 0 is always seen, so a
row's merged max is finite (a range whose keys a row does not see gives it max -inf and sum 0).

Imported lazily by the dispatcher: Triton decides at decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import device_arch, dot_tile, interpreting, next_power_of_2
from .state import LOG2E
from .tiles import Tiles, scoring_tiles

SPLIT_KEYS = 1024  # keys per program: a multiple of every tile's BLOCK_N (tiles.scoring_tiles: 16 to 64)


@triton.jit
def _scoring_kernel(
    Qs,
    Ks,
    Probs,
    Stats,
    stride_ql,
    stride_qq,
    stride_qh,
    stride_qd,
    stride_kl,
    stride_kh,
    stride_kp,
    stride_kd,
    stride_pq,
    stride_pl,
    stride_ph,
    stride_pp,
    n_queries,
    n_keys,
    head_dim,
    group,
    n_kv,
    query_start,
    qk_scale,
    split_keys,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STATS: tl.constexpr,
):
    pair = tl.program_id(0)
    layer = pair // n_kv
    kv_head = pair % n_kv
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(2)
    n_rows = group * n_queries
    row_ok = rows < n_rows
    head = kv_head * group + rows // n_queries
    query = rows % n_queries
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(
        Qs + layer * stride_ql + query[:, None] * stride_qq + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    k_base = Ks + layer * stride_kl + kv_head * stride_kh + offs_d[None, :] * stride_kd
    lo = split * split_keys
    hi = tl.minimum(lo + split_keys, n_keys)
    # Stats: STATS writes this range's (max, sum) into [pairs, splits, 2, n_rows]; the second launch reads the
    # merged ones from [pairs, 1, 2, n_rows], whichever range it writes
    if STATS:
        stats = Stats + (pair * tl.num_programs(2) + split) * 2 * n_rows + rows
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            key_ok = offs_n < hi
            seen = key_ok[None, :] & (offs_n[None, :] <= query_start + query[:, None])
            k = tl.load(k_base + offs_n[:, None] * stride_kp, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
            s = tl.where(seen, tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
            m_i = m_new
        tl.store(stats, m_i, mask=row_ok)
        tl.store(stats + n_rows, l_i, mask=row_ok)
    else:
        stats = Stats + pair * 2 * n_rows + rows
        m_i = tl.load(stats, mask=row_ok, other=0.0)
        inv_l = 1.0 / tl.load(stats + n_rows, mask=row_ok, other=1.0)
        p_base = Probs + layer * stride_pl + query[:, None] * stride_pq + head[:, None] * stride_ph
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            key_ok = offs_n < hi
            k = tl.load(k_base + offs_n[:, None] * stride_kp, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
            seen = offs_n[None, :] <= query_start + query[:, None]
            s = tl.where(seen, tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale, float("-inf"))
            p = tl.exp2(s - m_i[:, None]) * inv_l[:, None]  # 0 where unseen
            tl.store(p_base + offs_n[None, :] * stride_pp, p, mask=row_ok[:, None] & key_ok[None, :])


def scoring_softmax(
    queries: torch.Tensor,
    keys: torch.Tensor,
    scale: float,
    block_keys: int | None = None,
    query_start: int | None = None,
    split_keys: int = SPLIT_KEYS,
) -> torch.Tensor:
    """queries [n_l, n_q, Hq, D], keys [n_l, Hkv, P >= 1, D] (any strides) -> fp32 probs
    [n_q, n_l, Hq, P]; query q sees the keys up to query_start + q (None: P - 1, every key for
    every query; >= 0). block_keys overrides BLOCK_N (keys per tile) and split_keys the keys per
    program (a multiple of BLOCK_N), for tests."""
    n_layers, n_queries, n_heads, head_dim = queries.shape
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    block_d = max(16, next_power_of_2(head_dim))
    if interpreting():
        tiles = Tiles(dot_tile(group * n_queries, 64), dot_tile(n_keys, 32), 4, 1)
    else:  # per architecture, compiled ahead of time for every listed target (scripts/aot_matrix.py)
        tiles = scoring_tiles(group * n_queries, block_d, queries.dtype, device_arch(queries.device))
    block_r, block_n = tiles.block_m, tiles.block_n if block_keys is None else block_keys
    if split_keys < 1 or split_keys % block_n:
        raise ValueError(f"scoring_softmax: split_keys {split_keys} is no multiple of the {block_n}-key tile")
    n_rows, n_splits = group * n_queries, triton.cdiv(n_keys, split_keys)
    probs = torch.empty((n_queries, n_layers, n_heads, n_keys), dtype=torch.float32, device=queries.device)
    stats = torch.empty((n_layers * n_kv, n_splits, 2, n_rows), dtype=torch.float32, device=queries.device)
    grid = (n_layers * n_kv, triton.cdiv(n_rows, block_r), n_splits)
    sizes = (n_queries, n_keys, head_dim, group, n_kv, n_keys - 1 if query_start is None else query_start)
    constants = dict(
        PRECISION="ieee" if queries.dtype == torch.float32 else "tf32", BLOCK_R=block_r, BLOCK_N=block_n,
        BLOCK_D=block_d, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    strides = (*queries.stride(), *keys.stride(), *probs.stride())
    scale2 = float(scale) * LOG2E
    _scoring_kernel[grid](queries, keys, probs, stats, *strides, *sizes, scale2, split_keys, STATS=True, **constants)
    if n_splits > 1:  # the ranges' (max, sum) merged: max over ranges, each sum rescaled to it
        top = stats[:, :, 0].amax(dim=1)
        total = (stats[:, :, 1] * torch.exp2(stats[:, :, 0] - top[:, None])).sum(dim=1)
        stats = torch.stack((top, total), dim=1)[:, None]
    _scoring_kernel[grid](queries, keys, probs, stats, *strides, *sizes, scale2, split_keys, STATS=False, **constants)
    return probs
