"""Helpers of the MLX model-level method tests: tiny models, greedy runs and NumPy oracles.

Tolerance: our model runs in float32 (MLX CPU), the NumPy reference in float64, so logits agree
to float32 rounding accumulated over two layers: observed max |diff| <= 5e-7 * max|logit| on
these models. `assert_logits_close` allows 1e-5 * max|logit| (20x margin). H2O's own effect on
the logits is ~0.4 * max|logit| here, and a decode at the wrong position moves them by more than
1e-2 * max|logit|, so the tolerance cannot hide either.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specfill.backends.mlx import load
from specfill.backends.mlx.model import Model
from specfill.core.config import H2OConfig
from specfill.core.driver import CausalLM
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
    path: Path


def load_tiny(path: Path) -> Tiny:
    model, _ = load(path, dtype="float32", device="cpu")
    args, weights = load_weights(path)
    return Tiny(model, ReferenceModel(args, dict(weights)), args, path)


def variant(model: CausalLM, *, n_layers: int | None = None, context: int | None = None,
            prefill_step_size: int | None = None) -> CausalLM:
    """A model with `model`'s weights: its first n_layers blocks, another context length or
    prefill step (a separately loaded speculator in the tests)."""
    args = model.args
    args = replace(args, num_hidden_layers=n_layers or args.num_hidden_layers,
                   max_position_embeddings=context or args.max_position_embeddings)
    dropped = tuple(f"model.layers.{i}." for i in range(args.num_hidden_layers, model.args.num_hidden_layers))
    weights = [(name, w) for name, w in tree_flatten(model.model.parameters()) if not name.startswith(dropped)]
    built = Model(args)
    built.load_weights(weights, strict=True)
    mx.eval(built.parameters())
    return CausalLM(built, model.ops, prefill_step_size=prefill_step_size or model.prefill_step_size)


def greedy(model: Any, ids: Sequence[int], max_tokens: int, method: PrefillMethod = PrefillMethod(),
           info: PrefillInfo | None = None, stop_ids: frozenset[int] = frozenset(),
           progress: Any = None) -> list[int]:
    return list(model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(), stop_ids=stop_ids,
                                    method=method, info=info if info is not None else PrefillInfo(),
                                    progress=progress))


def assert_logits_close(ours: Any, want: np.ndarray, what: str) -> None:
    ours = np.asarray(ours.astype(mx.float32) if isinstance(ours, mx.array) else ours)
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} vs {want.shape}"
    err = float(np.abs(ours - want).max())
    assert err <= tolerance(want), f"{what}: max |diff| {err} > {tolerance(want)}"


def h2o_method(n_chunk: int, n_batch: int, local: int, heavy: int) -> PrefillMethod:
    return PrefillMethod("h2o", h2o=H2OConfig(chunk_size=n_chunk, batch_size=n_batch, local=local, heavy=heavy,
                                              dense_tail=0))
