"""GGUF tensor bytes -> MLX arrays, exactly, without MLX's own GGUF reader.

Why: `mx.load` (mlx 0.32) dequantizes Q4_K wrongly (Qwen2.5-Coder 1.5B Q4_K_M: 4.9M of 5.3M
super-blocks off by more than 1% of the tensor's range, up to 1.05x of it, against
`gguf.quants.dequantize`) and refuses whole files that hold other types. So the MLX backend decodes
the blocks itself, against the format definitions (ggml-quants.c; gguf-py is the reference):

- Types whose values are `scale * q + bias` with ONE (scale, bias) per 32 consecutive elements
  become MLX affine triples (group 32) holding the very same integer codes:
  Q4_0 (d*(q-8)), Q4_1 (d*q+m), Q5_0 (d*(q-16)), Q5_1 (d*q+m), Q8_0 (d*q, q signed -> q+128),
  Q4_K and Q5_K (8 sub-blocks of 32 per 256-block: scale d*sc, bias -dmin*m). Scales and biases are
  computed in float32 exactly as the reference computes them, so the triple dequantizes to the
  reference up to float32 rounding; casting them to the compute dtype later is MLX's own rounding.
- Every other type (Q2_K, Q3_K, Q6_K: 16-wide sub-blocks no MLX group size of 32/64/128 can hold;
  IQ*, TQ*, ...) and the float types are read by the core reader (gguf-py's dequantize) as float32.

MLX packs `bits`-wide unsigned codes as a little-endian bit stream in uint32 words (checked by
tests/mlx/test_gguf_quant_types.py against mx.quantize for 2..8 bits).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

GROUP = 32  # every type decoded here has exactly one (scale, bias) per 32 elements
ROWS_PER_PASS = 2048  # bounds the temporaries of one tensor (codes widen to uint64 in packing)

# ggml type id -> (name, bits, bytes per block, elements per block)
EXACT_TYPES: dict[int, tuple[str, int, int, int]] = {
    2: ("Q4_0", 4, 18, 32),
    3: ("Q4_1", 4, 20, 32),
    6: ("Q5_0", 5, 22, 32),
    7: ("Q5_1", 5, 24, 32),
    8: ("Q8_0", 8, 34, 32),
    12: ("Q4_K", 4, 144, 256),
    13: ("Q5_K", 5, 176, 256),
}

Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes [n, B] uint8, scales [n, B/32], biases [n, B/32]


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """Column of fp16 values at byte `start` of each block -> float32 [n, 1]."""
    return blocks[:, start : start + 2].copy().view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16*k] bytes -> [n, 32*k] codes: per 16 bytes, the 16 low nibbles then the 16 high ones."""
    n = qs.shape[0]
    pairs = qs.reshape(n, -1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 0x0F).reshape(n, -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Little-endian bit j of a [n, count/8] byte field, for j < count -> [n, count] of 0/1."""
    return np.unpackbits(qh, axis=-1, bitorder="little")[:, :count]


def _q4_0(b: np.ndarray) -> Decoded:
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b: np.ndarray) -> Decoded:
    return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> Decoded:
    d = _f16(b, 0)
    return _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6], 32) << 4), d, -16 * d


def _q5_1(b: np.ndarray) -> Decoded:
    return _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8], 32) << 4), _f16(b, 0), _f16(b, 2)


def _q8_0(b: np.ndarray) -> Decoded:
    d = _f16(b, 0)
    return (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of a Q4_K/Q5_K block -> (scale, bias) per 32-wide sub-block [n, 8].
    Sub-blocks 0-3 keep their 6-bit scale / min in bytes 0-3 / 4-7; sub-blocks 4-7 take 4 bits
    from bytes 8-11 and their top 2 bits from the top bits of bytes 0-3 / 4-7."""
    packed = b[:, 4:16].reshape(-1, 3, 4)
    lo, mid, top = packed[:, 0], packed[:, 1], packed[:, 2]
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mn = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=1)
    return _f16(b, 0) * sc.astype(np.float32), -(_f16(b, 2) * mn.astype(np.float32))


def _q4_k(b: np.ndarray) -> Decoded:
    return (_nibbles_by_32(b[:, 16:144]), *_k_scales(b))


def _q5_k(b: np.ndarray) -> Decoded:
    """Q5_K: 32 bytes of high bits (bit 2c / 2c+1 of byte l is element l of sub-block 2c / 2c+1)."""
    scales, biases = _k_scales(b)
    low = _nibbles_by_32(b[:, 48:176]).reshape(-1, 8, 32)
    high = (b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    return (low | (high << 4)).reshape(-1, 256), scales, biases


def _nibbles_by_32(qs: np.ndarray) -> np.ndarray:
    """K-quant nibble order: per 32 bytes, 32 low nibbles (one sub-block) then 32 high ones."""
    n = qs.shape[0]
    pairs = qs.reshape(n, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 0x0F).reshape(n, -1)


_DECODERS: dict[int, Callable[[np.ndarray], Decoded]] = {
    2: _q4_0,
    3: _q4_1,
    6: _q5_0,
    7: _q5_1,
    8: _q8_0,
    12: _q4_k,
    13: _q5_k,
}


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] codes < 2**bits -> [rows, cols*bits/32] uint32: MLX's little-endian bit stream
    (8 codes -> `bits` bytes: code j at bits [bits*j, bits*(j+1)) of a 64-bit word)."""
    rows, cols = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32)
    if bits == 4:
        pairs = codes.reshape(rows, -1, 2)
        return np.ascontiguousarray(pairs[..., 0] | (pairs[..., 1] << 4)).view(np.uint32)
    eights = codes.reshape(rows, -1, 8).astype(np.uint64) << (np.arange(8, dtype=np.uint64) * bits)
    words = np.bitwise_or.reduce(eights, axis=-1)  # [rows, cols/8]: 8 codes in the low 8*bits bits
    stream = words.view(np.uint8).reshape(rows, -1, 8)[..., :bits]  # the low `bits` bytes of each word
    return np.ascontiguousarray(stream).reshape(rows, -1).view(np.uint32)


def affine_triple(raw: np.ndarray, shape: tuple[int, ...], ggml_type: int) -> tuple[np.ndarray, ...]:
    """A tensor's bytes (uint8) of an EXACT_TYPES type -> (packed uint32 [rows, cols*bits/32],
    scales float32 [rows, cols/32], biases float32 [rows, cols/32]); rows = all leading dims."""
    _, bits, block_bytes, block_elems = EXACT_TYPES[ggml_type]
    cols = shape[-1]
    rows = raw.size * block_elems // block_bytes // cols
    by_row = raw.reshape(rows, -1)
    packed = np.empty((rows, cols * bits // 32), np.uint32)
    scales = np.empty((rows, cols // GROUP), np.float32)
    biases = np.empty_like(scales)
    for start in range(0, rows, ROWS_PER_PASS):
        part = by_row[start : start + ROWS_PER_PASS]
        n = part.shape[0]
        codes, s, b = _DECODERS[ggml_type](part.reshape(-1, block_bytes))
        packed[start : start + n] = pack_codes(codes.reshape(n, cols), bits)
        scales[start : start + n] = s.reshape(n, -1)
        biases[start : start + n] = b.reshape(n, -1)
    return packed, scales, biases


def dequantize_triple(packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> np.ndarray:
    """NumPy inverse of `pack_codes` + affine (for the load-time spot check): float32 [rows, cols]."""
    rows = packed.shape[0]
    stream = np.unpackbits(packed.view(np.uint8), axis=-1, bitorder="little").reshape(rows, -1, bits)
    codes = (stream.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(-1)
    q = codes.astype(np.float32).reshape(rows, -1, GROUP)
    return (q * scales[..., None] + biases[..., None]).reshape(rows, -1)
