"""Helpers of the transformers adapter tests: an adapted CausalLM, prompts, the tolerance.

Tolerance: the adapter and transformers both compute in float32 on the CPU, with the same
projections, norms and RoPE (transformers' own code); only the attention itself differs (specfill's
against torch's SDPA as transformers calls it), so logits agree to float32 rounding: observed
max |diff| <= 3e-7 on logits of max |logit| ~ 0.5-10. `assert_close` allows 1e-5 * max|logit|
(the project's fp32 tolerance, tests/fixtures/reference_runs), far below what a wrong position,
window or cache slot changes (> 1e-2 * max|logit|).
"""
from __future__ import annotations

import numpy as np
import torch

from specfill.backends.torch_cuda.adapted import adapt
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.driver import CausalLM
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig

RELATIVE_TOLERANCE = 1e-5


def adapted(lm: torch.nn.Module, prefill_step_size: int = 2048) -> CausalLM:
    """The transformers model `lm` adapted, as specfill's CausalLM on the CPU in float32."""
    return CausalLM(adapt(lm), TorchOps(torch.device("cpu"), torch.float32), prefill_step_size=prefill_step_size)


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
