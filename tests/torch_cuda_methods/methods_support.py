"""Helpers of the model-level method tests: tiny models, greedy runs and NumPy oracles.

Tolerance: our model runs in float32, the NumPy reference in float64, so logits agree to float32
rounding accumulated over two layers: observed max |diff| <= 5e-7 * max|logit| on these models.
`assert_logits_close` allows 1e-5 * max|logit| (20x margin). H2O's own effect on the logits is
~0.4 * max|logit| here, and a decode at the wrong position moves them by >1e-2 * max|logit|, so
the tolerance cannot hide either.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from specfill.backends.torch_cuda import from_weights, load
from specfill.core.driver import CausalLM
from specfill.core.config import H2OConfig
from specfill.core.models import ModelArgs
from specfill.core.reference.model import ReferenceModel
from specfill.core.runtime import PrefillInfo, PrefillMethod, SamplingConfig
from specfill.core.io.weights import load_weights
from tests.fixtures.reference_runs import (RELATIVE_TOLERANCE, prompt, reference_h2o_greedy,  # noqa: F401
                                           reference_speculator, tolerance)



@dataclass
class Tiny:
    model: CausalLM
    ref: ReferenceModel
    args: ModelArgs
    weights: dict[str, np.ndarray]


def load_tiny(path: Path) -> Tiny:
    model, _ = load(path, dtype="float32", device="cpu")
    args, weights = load_weights(path)
    return Tiny(model, ReferenceModel(args, weights), args, dict(weights))


def greedy(model: CausalLM, ids: Sequence[int], max_tokens: int, method: PrefillMethod = PrefillMethod(),
           info: PrefillInfo | None = None, stop_ids: frozenset[int] = frozenset(), progress: Any = None) -> list[int]:
    return list(model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(), stop_ids=stop_ids,
                                    method=method, info=info if info is not None else PrefillInfo(),
                                    progress=progress))


def assert_logits_close(ours: Any, want: np.ndarray, what: str) -> None:
    ours = ours.detach().float().cpu().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} vs {want.shape}"
    err = float(np.abs(ours - want).max())
    assert err <= tolerance(want), f"{what}: max |diff| {err} > {tolerance(want)}"


