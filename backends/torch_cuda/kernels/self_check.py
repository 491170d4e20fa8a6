"""The torch side of the first-use kernel self-check (the mechanism: conformance/self_check.py).

The small fixed cases the dispatchers run a Triton kernel and its torch twin on, before the
kernel's first use in the process for a (kernel, dtype, shape class). The shape class is what a
kernel is compiled for besides its dtype: the head dim D (a constexpr tile) and the GQA group G.
Cases are tiny (2 KV heads, tens of tokens), seeded, and built on the caller's device.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from specfill.conformance.self_check import KERNEL_SELF_CHECK, Comparison

from .state import IntraResult

TWIN = "the torch twin"
CASE_KV_HEADS = 2
CASE_CHUNK = 16  # intra: 40 tokens = two full chunks of 16 and a partial one
CASE_TOKENS = 40
CASE_SLOTS = 24  # inter: memory slots
CASE_KEYS = 50  # scoring: prompt keys (3 queries, 2 layers)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _random(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)


def attention_case(like: torch.Tensor, group: int, n_keys: int) -> tuple[torch.Tensor, ...]:
    """q [2G, T, D], k/v [2, n_keys, D] in like's dtype and device (T = CASE_TOKENS, D = like's)."""
    head_dim = like.shape[-1]
    q = _random((CASE_KV_HEADS * group, CASE_TOKENS, head_dim), like.dtype, like.device, 1)
    k = _random((CASE_KV_HEADS, n_keys, head_dim), like.dtype, like.device, 2)
    v = _random((CASE_KV_HEADS, n_keys, head_dim), like.dtype, like.device, 3)
    return q, k, v


def scoring_case(like: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """queries [2, 3, 2G, D], keys [2, 2, CASE_KEYS, D] in like's dtype and device."""
    head_dim = like.shape[-1]
    queries = _random((2, 3, CASE_KV_HEADS * group, head_dim), like.dtype, like.device, 4)
    keys = _random((2, CASE_KV_HEADS, CASE_KEYS, head_dim), like.dtype, like.device, 5)
    return queries, keys


def _numpy(x: torch.Tensor):
    return x.detach().to(device="cpu", dtype=torch.float64).numpy()


def result_comparisons(kernel: IntraResult, twin: IntraResult) -> list[Comparison]:
    """m, l, o and the column sums of two AttentionResults, as (name, kernel, twin) arrays."""
    pairs = [("m", kernel.state.m, twin.state.m), ("l", kernel.state.l, twin.state.l),
             ("o", kernel.state.o, twin.state.o)]
    if kernel.colsum is not None or twin.colsum is not None:
        pairs.append(("colsum", kernel.colsum, twin.colsum))
    return [(name, _numpy(a), _numpy(b)) for name, a, b in pairs]


def tensor_comparisons(name: str, kernel: torch.Tensor, twin: torch.Tensor) -> list[Comparison]:
    """One output (the scoring probabilities) as a (name, kernel, twin) comparison."""
    return [(name, _numpy(kernel), _numpy(twin))]


def kernel_passes(kernel: str, like: torch.Tensor, group: int,
                  run: Callable[[], Iterable[Comparison]]) -> bool:
    """True when the Triton kernel `kernel` passed (now or earlier in this process) its self-check
    for like's dtype and head dim and this GQA group; `run` runs the small case."""
    shape_class = f"D={like.shape[-1]}, G={group}"
    return KERNEL_SELF_CHECK.passes("cuda", kernel, _dtype_name(like.dtype), shape_class, TWIN, run)
