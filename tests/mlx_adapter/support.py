"""Helpers of the adapter tests: an adapted CausalLM of an mlx-lm model, prompts, the tolerance.

Tolerance: the adapter and mlx-lm both compute in float32 with the same MLX kernels, so their
logits agree to float32 rounding: observed exactly equal on every architecture here (MLX CPU).
`assert_close` allows 1e-5 * max|logit| (the project's fp32 tolerance, tests/fixtures/reference_runs),
far below what a wrong position or norm changes (> 1e-2 * max|logit|).
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specfill.backends.mlx.adapted import AdaptedOps, adapt
from specfill.core.driver import CausalLM
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig

RELATIVE_TOLERANCE = 1e-5


def adapted(lm: nn.Module, prefill_step_size: int = 2048) -> CausalLM:
    """The mlx-lm model `lm` adapted in place, as specfill's CausalLM on MLX's CPU."""
    return CausalLM(adapt(lm), AdaptedOps(mx.Device(mx.cpu)), prefill_step_size=prefill_step_size)


def prompt(n: int, vocab: int = 320, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(4, vocab, size=n).tolist()


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    err, bound = float(np.abs(got - want).max()), RELATIVE_TOLERANCE * max(1.0, float(np.abs(want).max()))
    assert err <= bound, f"{what}: max |diff| {err} > {bound}"


def greedy(model: CausalLM, ids: list[int], max_tokens: int, method: PrefillMethod = PrefillMethod(),
           info: GenerationInfo | None = None, drafting: Drafting | None = None) -> list[int]:
    return list(model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(), stop_ids=frozenset(),
                                    method=method, info=info if info is not None else GenerationInfo(),
                                    drafting=drafting))
