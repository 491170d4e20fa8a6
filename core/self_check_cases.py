"""The small fixed cases of the first-use kernel self-check (core/self_check.py), for any backend.

The cases are what a kernel is compiled for besides its dtype, its shape class: the head dim D
and the GQA group G. They are tiny (2 KV heads, tens of tokens) and seeded; a backend only says
how to make a seeded array like the caller's (dtype, device) and how to read one back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from .self_check import KERNEL_SELF_CHECK, Comparison

CASE_KV_HEADS = 2
CASE_CHUNK = 16  # intra: 40 tokens = two full chunks of 16 and a partial one
CASE_TOKENS = 40
CASE_SLOTS = 24  # inter: memory slots
CASE_KEYS = 50  # scoring: prompt keys (3 queries, 2 layers)


@dataclass(frozen=True)
class CheckCases:
    """One backend's cases. random(shape, like, seed): a seeded normal array in like's dtype and
    device; numpy(x): float64 NumPy (evaluating it, so a compile or launch error surfaces here);
    dtype_name(dtype): "float32", ..."""

    backend: str
    twin: str
    random: Callable[[tuple[int, ...], Any, int], Any]
    numpy: Callable[[Any], np.ndarray]
    dtype_name: Callable[[Any], str]

    def attention_case(self, like: Any, group: int, n_keys: int) -> tuple[Any, Any, Any]:
        """q [2G, T, D], k/v [2, n_keys, D] (T = CASE_TOKENS, D = like's head dim)."""
        head_dim = like.shape[-1]
        return (
            self.random((CASE_KV_HEADS * group, CASE_TOKENS, head_dim), like, 1),
            self.random((CASE_KV_HEADS, n_keys, head_dim), like, 2),
            self.random((CASE_KV_HEADS, n_keys, head_dim), like, 3),
        )

    def scoring_case(self, like: Any, group: int) -> tuple[Any, Any]:
        """queries [2, 3, 2G, D], keys [2, 2, CASE_KEYS, D]."""
        head_dim = like.shape[-1]
        return (
            self.random((2, 3, CASE_KV_HEADS * group, head_dim), like, 4),
            self.random((2, CASE_KV_HEADS, CASE_KEYS, head_dim), like, 5),
        )

    def result_comparisons(self, kernel: Any, twin: Any) -> list[Comparison]:
        """m, l, o (and the column sums) of two IntraResults / InterResults."""
        pairs = [
            ("m", kernel.state.m, twin.state.m),
            ("l", kernel.state.l, twin.state.l),
            ("o", kernel.state.o, twin.state.o),
        ]
        if kernel.colsum is not None or twin.colsum is not None:
            pairs.append(("colsum", kernel.colsum, twin.colsum))
        return [(name, self.numpy(a), self.numpy(b)) for name, a, b in pairs]

    def tensor_comparisons(self, name: str, kernel: Any, twin: Any) -> list[Comparison]:
        """One output (the scoring probabilities) as a (name, kernel, twin) comparison."""
        return [(name, self.numpy(kernel), self.numpy(twin))]

    def kernel_passes(self, kernel: str, like: Any, group: int, run: Callable[[], Iterable[Comparison]]) -> bool:
        """True when the custom kernel `kernel` passed (now or earlier in this process) its
        self-check for like's dtype and head dim and this GQA group; `run` runs the small case."""
        shape_class = f"D={like.shape[-1]}, G={group}"
        return KERNEL_SELF_CHECK.passes(self.backend, kernel, self.dtype_name(like.dtype), shape_class, self.twin, run)
