"""Triton kernel behind speculative-prefill scoring.

One program per (scoring layer, KV head, block of rows): its rows are the n_q scoring queries
of each of the G query heads that read this KV head (at most 64 per program), so a key block is
loaded once for all of them. Two
passes over the prompt keys: the first finds each row's max and sum (online softmax), the
second recomputes the logits and writes exp2(s - m) / l. Query q sits at position
query_start + q and sees the keys at or before it (an observation window's causal mask; with
query_start = P - 1, the last prompt token and the look-ahead, every key); key 0 is always seen.

Imported lazily by the dispatcher: Triton decides at decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import device_arch, dot_tile, interpreting, next_power_of_2
from .state import LOG2E
from .tiles import Tiles, scoring_tiles


@triton.jit
def _scoring_kernel(
    Qs,
    Ks,
    Probs,
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
    query_start,
    qk_scale,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    layer = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < group * n_queries
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

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    for start_n in range(0, n_keys, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_keys
        seen = key_ok[None, :] & (offs_n[None, :] <= query_start + query[:, None])
        k = tl.load(k_base + offs_n[:, None] * stride_kp, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.where(seen, tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: the first block holds key 0
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
        m_i = m_new

    inv_l = 1.0 / l_i
    p_base = Probs + layer * stride_pl + query[:, None] * stride_pq + head[:, None] * stride_ph
    for start_n in range(0, n_keys, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_keys
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
) -> torch.Tensor:
    """queries [n_l, n_q, Hq, D], keys [n_l, Hkv, P >= 1, D] (any strides) -> fp32 probs
    [n_q, n_l, Hq, P]; query q sees the keys up to query_start + q (None: P - 1, every key for
    every query; >= 0). block_keys overrides BLOCK_N (keys per tile) for tests."""
    n_layers, n_queries, n_heads, head_dim = queries.shape
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    block_d = max(16, next_power_of_2(head_dim))
    if interpreting():
        tiles = Tiles(dot_tile(group * n_queries, 64), dot_tile(n_keys, 32), 4, 1)
    else:  # per architecture, compiled ahead of time for every listed target (scripts/aot_matrix.py)
        tiles = scoring_tiles(group * n_queries, block_d, queries.dtype, device_arch(queries.device))
    block_r, block_n = tiles.block_m, tiles.block_n if block_keys is None else block_keys
    probs = torch.empty((n_queries, n_layers, n_heads, n_keys), dtype=torch.float32, device=queries.device)
    _scoring_kernel[(n_layers, n_kv, triton.cdiv(group * n_queries, block_r))](
        queries,
        keys,
        probs,
        *queries.stride(),
        *keys.stride(),
        *probs.stride(),
        n_queries,
        n_keys,
        head_dim,
        group,
        n_keys - 1 if query_start is None else query_start,
        float(scale) * LOG2E,
        PRECISION="ieee" if queries.dtype == torch.float32 else "tf32",
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return probs
