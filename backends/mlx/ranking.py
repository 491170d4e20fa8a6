"""Deterministic descending order on MLX: ties go to the lower index, on any device.

mx.argsort promises no stability (the CPU sort happens to be stable, Metal's need not be), so
the order is taken on a unique 64-bit key: the value's order-preserving bits, then the index.
"""

from __future__ import annotations

import mlx.core as mx

_SIGN = 0x80000000


def _ascending_bits(values: mx.array) -> mx.array:
    """uint32 whose unsigned order is the float32 order (-0.0 and 0.0 map to one key)."""
    values = values.astype(mx.float32)
    values = mx.where(values == 0, mx.zeros_like(values), values)  # -0.0 ties with 0.0, as in NumPy
    bits = values.view(mx.uint32)
    negative = (bits & _SIGN) != 0
    return mx.where(negative, ~bits, bits | _SIGN)


def descending_order(values: mx.array) -> mx.array:
    """Indices that sort the last axis by value descending, ties to the lower index (int32)."""
    n = values.shape[-1]
    descending = (~_ascending_bits(values)).astype(mx.uint64)
    index = mx.arange(n, dtype=mx.uint64)
    key = mx.left_shift(descending, mx.array(32, dtype=mx.uint64)) | index
    return mx.argsort(key, axis=-1).astype(mx.int32)
