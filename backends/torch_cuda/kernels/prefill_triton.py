"""Triton attention for a prefill step: the step's queries against every cached key, lower-right causal.

A prefill step of T queries after `start` cached slots (start = S - T; 0 for a prompt's first step)
lets query t see slots 0..start + t. One program per (block of BLOCK_M queries, query head), as in
Triton's fused-attention tutorial and FlashAttention-2:
  - the keys every row of the block sees (0..start + the block's first row) are walked in whole
    BLOCK_N tiles with no mask at all: the prefix of a long prompt is almost all of the work;
  - the band after them (the causal diagonal, and the ragged end of the keys) is walked with the
    lower-right mask;
  - the online softmax keeps its row maxima and sums in float32 (exp2, the scale folded into
    log2 units), and the output is normalised once at the end.
Query head h reads KV head h // group through pointer arithmetic: grouped KV heads are never
expanded in memory. Blocks are launched heaviest first (the last queries see the most keys), so
a causal step's long blocks do not start last. No row is ever empty (every query sees slot 0), so
no row statistic is -inf after the first tile and no output is NaN.

A candidate of backends/torch_cuda/attention_choice.py's probe, beside torch's fused kernels: it
runs where the probe times it fastest and correct on the device. Imported lazily: Triton decides
at decoration time whether it interprets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import device_arch, dot_tile, interpreting, next_power_of_2
from .flash_triton import _rows
from .state import LOG2E
from .tiles import prefill_tiles


@triton.jit
def _tile(q, k, v, m_i, l_i, acc, visible, qk_scale, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of the online softmax: (m, l, acc) after keys k / values v [BLOCK_N, D]; with
    MASKED, scores where `visible` is False are -inf (the band; every row keeps slot 0, so m stays
    finite once the first tile is in). The scale (log2 units, > 0) is applied as the fused-attention
    tutorial does: the raw scores' row maxima scaled (a max commutes with a positive scale), then one
    fused multiply-add per score inside exp2, where scaling the tile first costs a multiply and a
    subtraction per score: 4 float32 ops a score instead of 5 (sm_90 cubins: 60 FMUL and 32 FADD fewer,
    32 FFMA more), and a Hopper's attention is bound by this element-wise work beside its MMAs."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _bounds(n_queries, n_keys, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The program's block (heaviest first), query head, first row, the start of its step, the end of
    the whole key tiles every row of the block sees, and the end of its band."""
    block = tl.num_programs(0) - 1 - tl.program_id(0)
    first_row = block * BLOCK_M
    start = n_keys - n_queries
    open_end = ((start + first_row + 1) // BLOCK_N) * BLOCK_N
    band_end = tl.minimum(start + first_row + BLOCK_M, n_keys)
    return tl.program_id(1), first_row, start, open_end, band_end


@triton.jit
def _store(O, out, head, offs_m, offs_d, row_ok, d_ok, stride_oh, stride_ot, stride_od):
    tl.store(
        O + head * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
        out.to(O.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _prefill_kernel(
    Q, K, V, O,
    stride_qh, stride_qt, stride_qd, stride_kh, stride_kt, stride_kd,
    stride_vh, stride_vt, stride_vd, stride_oh, stride_ot, stride_od,
    n_queries, n_keys, group, qk_scale,
    HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    head, first_row, start, open_end, band_end = _bounds(n_queries, n_keys, BLOCK_M, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM  # all true (folded away) when the head size is a power of 2
    offs_m, row_ok, q = _rows(
        Q + head * stride_qh + offs_d[None, :] * stride_qd, stride_qt, first_row, n_queries, d_ok, BLOCK_M
    )
    kv_head = head // group
    k_base = K + kv_head * stride_kh + offs_d[None, :] * stride_kd
    v_base = V + kv_head * stride_vh + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, open_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + offs_n[:, None] * stride_kt, mask=d_ok[None, :], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vt, mask=d_ok[None, :], other=0.0)
        m_i, l_i, acc = _tile(q, k, v, m_i, l_i, acc, 0, qk_scale, False, PRECISION)
    for start_n in range(open_end, band_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_keys
        k = tl.load(k_base + offs_n[:, None] * stride_kt, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vt, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        visible = key_ok[None, :] & (offs_n[None, :] <= start + offs_m[:, None])
        m_i, l_i, acc = _tile(q, k, v, m_i, l_i, acc, visible, qk_scale, True, PRECISION)
    _store(O, acc / l_i[:, None], head, offs_m, offs_d, row_ok, d_ok, stride_oh, stride_ot, stride_od)


@triton.jit
def _prefill_tma_kernel(
    desc_q, desc_k, desc_v, O,
    stride_oh, stride_ot, stride_od,
    n_queries, n_keys, group, qk_scale,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """_prefill_kernel with q, k and v read through tensor descriptors (TMA on sm_90 and later: the
    copy engine fetches each tile, rows past the end come back zero), head size a power of 2."""
    head, first_row, start, open_end, band_end = _bounds(n_queries, n_keys, BLOCK_M, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_m = first_row + tl.arange(0, BLOCK_M)
    q = desc_q.load([head, first_row, 0]).reshape(BLOCK_M, BLOCK_D)
    kv_head = head // group

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, open_end, BLOCK_N):
        k = desc_k.load([kv_head, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = desc_v.load([kv_head, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        m_i, l_i, acc = _tile(q, k, v, m_i, l_i, acc, 0, qk_scale, False, PRECISION)
    for start_n in range(open_end, band_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = desc_k.load([kv_head, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = desc_v.load([kv_head, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        visible = (offs_n < n_keys)[None, :] & (offs_n[None, :] <= start + offs_m[:, None])
        m_i, l_i, acc = _tile(q, k, v, m_i, l_i, acc, visible, qk_scale, True, PRECISION)
    row_ok = offs_m < n_queries
    _store(O, acc / l_i[:, None], head, offs_m, offs_d, row_ok, offs_d < BLOCK_D, stride_oh, stride_ot, stride_od)


def launch_config(
    n_queries: int, n_keys: int, head_dim: int, dtype: torch.dtype, device: torch.device, wide: bool = False
) -> tuple[int, int, int, dict[str, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, launch options): on a GPU the device architecture's tiles
    (tiles.prefill_tiles, wide or not, compiled ahead of time by scripts/aot_matrix.py); in the
    interpreter, which runs one tile at a time in NumPy, small tiles (every dot dimension >= 16)."""
    block_d = max(16, next_power_of_2(head_dim))
    if interpreting():
        return dot_tile(n_queries, 32), dot_tile(n_keys, 32), block_d, {}
    tiles = prefill_tiles(block_d, dtype, device_arch(device), wide)
    return tiles.block_m, tiles.block_n, block_d, {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    tiles: tuple[int, int] | None = None,
    tma: bool = False,
    wide: bool = False,
) -> torch.Tensor:
    """q [1, Hq, T, D], k / v [1, Hkv, S, D] (S >= T, any strides; Hkv divides Hq) -> [1, Hq, T, D]
    in q's dtype (a transposed view of a contiguous [1, T, Hq, D]): query t sees slots
    0..S - T + t. scale None: D ** -0.5. tiles overrides (BLOCK_M, BLOCK_N) for tests. tma: read
    q, k and v through tensor descriptors (_prefill_tma_kernel; a power-of-2 head size, 16-byte
    aligned rows and heads, a contiguous last dimension; sm_90 and later on a GPU). wide: with tma,
    tiles.prefill_tiles' wide tiles (sm_90, 16-bit heads up to 128). The scale must be positive (the
    tile scales the row maxima of the raw scores, see _tile): a ValueError otherwise."""
    _, n_heads, n_queries, head_dim = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    if n_keys < n_queries or n_heads % n_kv or v.shape[-1] != head_dim or n_queries < 1:
        raise ValueError(f"prefill_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.device.type != "cuda" and not interpreting():
        raise RuntimeError(f"the Triton prefill kernel needs CUDA tensors (got {q.device.type})")
    scale = head_dim**-0.5 if scale is None else scale
    if not scale > 0:
        raise ValueError(f"the Triton prefill kernel takes a positive scale, not {scale}")
    if wide and not tma:
        raise ValueError("wide prefill tiles are the TMA kernel's (tma=True)")
    q3, k3, v3 = q[0], k[0], v[0]
    # the inputs' own refusal first, then the tiles' (wide: 16-bit heads up to 128 on sm_90)
    if tma and (head_dim & (head_dim - 1) or head_dim < 16 or any(x.stride(-1) != 1 for x in (q3, k3, v3))):
        raise ValueError(f"the TMA prefill kernel takes power-of-2 heads with a contiguous last dim, not {head_dim}")
    block_m, block_n, block_d, options = launch_config(n_queries, n_keys, head_dim, q.dtype, q.device, wide)
    if tiles is not None:
        block_m, block_n = tiles
    # written as [T, Hq, D]: the layer's o_proj reads rows of Hq x D, which a [Hq, T, D] output would copy
    o = torch.empty((n_queries, n_heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)
    sizes = (n_queries, n_keys, n_heads // n_kv, float(scale) * LOG2E)
    constants = dict(
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d
    )
    grid = (triton.cdiv(n_queries, block_m), n_heads)
    if not tma:
        _prefill_kernel[grid](
            q3, k3, v3, o, *q3.stride(), *k3.stride(), *v3.stride(), *o.stride(), *sizes,
            HEAD_DIM=head_dim, **constants, **options,
        )  # fmt: skip
        return o[None]
    from triton.tools.tensor_descriptor import TensorDescriptor

    q_desc, k_desc, v_desc = (
        TensorDescriptor(x, list(x.shape), list(x.stride()), [1, rows, block_d])
        for x, rows in ((q3, block_m), (k3, block_n), (v3, block_n))
    )
    _prefill_tma_kernel[grid](q_desc, k_desc, v_desc, o, *o.stride(), *sizes, **constants, **options)
    return o[None]
