"""The MLX side of the first-use kernel self-check (the mechanism: conformance/self_check.py).

The small fixed cases the dispatchers run a Metal kernel and its MLX-ops twin on, before the
kernel's first use in the process for a (kernel, dtype, shape class). The shape class is what
MLX compiles a kernel per besides its dtype: the template parameters D (head dim) and G (GQA
group). Cases are tiny (2 KV heads, tens of tokens), seeded, and evaluated inside the check so
that a Metal compile error surfaces there.
"""
from __future__ import annotations

from typing import Callable, Iterable

import mlx.core as mx
import numpy as np

from specfill.conformance.self_check import KERNEL_SELF_CHECK, Comparison

TWIN = "the MLX-ops twin"
CASE_KV_HEADS = 2
CASE_CHUNK = 16  # intra: 40 tokens = two full chunks of 16 and a partial one
CASE_TOKENS = 40
CASE_SLOTS = 24  # inter: memory slots
CASE_KEYS = 50  # scoring: prompt keys (3 queries, 2 layers)


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


def _random(shape: tuple[int, ...], dtype: mx.Dtype, seed: int) -> mx.array:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return mx.array(values).astype(dtype)


def attention_case(like: mx.array, group: int, n_keys: int) -> tuple[mx.array, ...]:
    """q [2G, T, D], k/v [2, n_keys, D] in like's dtype (T = CASE_TOKENS, D = like's)."""
    head_dim = like.shape[-1]
    q = _random((CASE_KV_HEADS * group, CASE_TOKENS, head_dim), like.dtype, 1)
    k = _random((CASE_KV_HEADS, n_keys, head_dim), like.dtype, 2)
    v = _random((CASE_KV_HEADS, n_keys, head_dim), like.dtype, 3)
    return q, k, v


def scoring_case(like: mx.array, group: int) -> tuple[mx.array, mx.array]:
    """queries [2, 3, 2G, D], keys [2, 2, CASE_KEYS, D] in like's dtype."""
    head_dim = like.shape[-1]
    return (_random((2, 3, CASE_KV_HEADS * group, head_dim), like.dtype, 4),
            _random((2, CASE_KV_HEADS, CASE_KEYS, head_dim), like.dtype, 5))


def _numpy(x: mx.array) -> np.ndarray:
    return np.asarray(x.astype(mx.float32), dtype=np.float64)


def result_comparisons(kernel, twin) -> list[Comparison]:
    """m, l, o and colsum of two IntraResults / InterResults, as (name, kernel, twin) arrays."""
    pairs = [("m", kernel.state.m, twin.state.m), ("l", kernel.state.l, twin.state.l),
             ("o", kernel.state.o, twin.state.o), ("colsum", kernel.colsum, twin.colsum)]
    mx.eval([a for _, a, _ in pairs])  # a Metal compile or launch error surfaces here
    return [(name, _numpy(a), _numpy(b)) for name, a, b in pairs]


def tensor_comparisons(name: str, kernel: mx.array, twin: mx.array) -> list[Comparison]:
    """One output (the scoring probabilities) as a (name, kernel, twin) comparison, evaluated."""
    mx.eval(kernel)
    return [(name, _numpy(kernel), _numpy(twin))]


def kernel_passes(kernel: str, like: mx.array, group: int,
                  run: Callable[[], Iterable[Comparison]]) -> bool:
    """True when the Metal kernel `kernel` passed (now or earlier in this process) its self-check
    for like's dtype and head dim and this GQA group; `run` runs the small case."""
    shape_class = f"D={like.shape[-1]}, G={group}"
    return KERNEL_SELF_CHECK.passes("mlx", kernel, _dtype_name(like.dtype), shape_class, TWIN, run)
