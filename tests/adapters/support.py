"""Helpers of the adapter tests, the same for both backends: prompts, the tolerance, greedy decoding,
the methods' test settings and the spy that records what a method's attention received.

Tolerance: the adapter and the library it adapts compute in float32 with the same projections,
norms and RoPE (the library's own code), so their logits agree to float32 rounding (per backend:
mlx_backend.py, torch_backend.py). `assert_close` allows 1e-5 * max|logit| (the project's fp32
tolerance, tests/fixtures/reference_runs), far below what a wrong position, norm, window or cache
slot changes (> 1e-2 * max|logit|).
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import numpy as np

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.driver import CausalLM
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig

RELATIVE_TOLERANCE = 1e-5

# backend -> the libraries its adapter tests need (the folder's tests of a backend skip without them)
BACKENDS = {"mlx": ("mlx", "mlx_lm"), "torch": ("torch", "transformers")}

H2O = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=8, batch_size=64, local=2, heavy=3, dense_tail=0, layers="all"))


def installed(backend: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in BACKENDS[backend])


def spec(keep: float, lookahead: int = 2) -> PrefillMethod:
    return PrefillMethod(
        "specprefill",
        speculator="self:1",
        specprefill=SpecPrefillConfig(keep_ratio=keep, lookahead=lookahead, select_chunk=4, pool_kernel=3),
    )


def prompt(n: int, vocab: int = 320, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(4, vocab, size=n).tolist()


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    err, bound = float(np.abs(got - want).max()), RELATIVE_TOLERANCE * max(1.0, float(np.abs(want).max()))
    assert err <= bound, f"{what}: max |diff| {err} > {bound}"


def greedy(
    model: CausalLM,
    ids: list[int],
    max_tokens: int,
    method: PrefillMethod = PrefillMethod(),
    info: GenerationInfo | None = None,
    drafting: Drafting | None = None,
) -> list[int]:
    return list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=method,
            info=info if info is not None else GenerationInfo(),
            drafting=drafting,
        )
    )


def record(monkeypatch, cls, to_numpy: Callable) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Every call of cls (a PrefillAttention) as (layer, q, k, v, output), NumPy [H, T, D]."""
    calls = []
    original = cls.__call__

    def spy(self, layer, q, k, v):
        out = original(self, layer, q, k, v)
        calls.append((layer, *(to_numpy(a[0]) for a in (q, k, v, out))))
        return out

    monkeypatch.setattr(cls, "__call__", spy)
    return calls
