"""Helpers of the model-level method tests, one set for every backend: tiny models, greedy runs,
NumPy oracles, and the few things each backend spells its own way (a model variant, a cache's fill).

Tolerance: our model runs in float32 (torch on CPU, MLX's CPU device), the NumPy reference in
float64, so logits agree to float32 rounding accumulated over two layers: observed max |diff| <=
5e-7 * max|logit| on these models. `assert_logits_close` allows 1e-5 * max|logit| (20x margin).
H2O's own effect on the logits is ~0.4 * max|logit| here, and a decode at the wrong position moves
them by more than 1e-2 * max|logit|, so the tolerance cannot hide either.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from specfill import api
from specfill.core.config import H2OConfig
from specfill.core.driver import CausalLM
from specfill.core.io.weights import load_weights
from specfill.core.models import ModelArgs
from specfill.core.reference.model import ReferenceModel
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.fixtures.reference_runs import (  # re-exported for the tests of this folder
    RELATIVE_TOLERANCE,  # noqa: F401
    prompt,  # noqa: F401
    reference_h2o_greedy,  # noqa: F401
    reference_speculator,  # noqa: F401
    tolerance,
)

BACKENDS = ("cuda", "mlx")
MODULES = {"cuda": "torch", "mlx": "mlx.core"}  # what each backend needs installed


@dataclass
class Tiny:
    backend: str
    model: CausalLM
    ref: ReferenceModel
    args: ModelArgs
    weights: dict[str, np.ndarray]
    path: Path


def load_tiny(backend: str, path: Path) -> Tiny:
    model, _ = api.load(path, backend=backend, dtype="float32", device="cpu")
    args, weights = load_weights(path)
    return Tiny(backend, model, ReferenceModel(args, dict(weights)), args, dict(weights), path)


def build(t: Tiny, args: ModelArgs, weights: dict[str, np.ndarray], prefill_step_size: int) -> CausalLM:
    """A float32 CPU model on t's backend from Hugging Face-named weights."""
    if t.backend == "cuda":
        import torch

        from specfill.backends.torch_cuda import from_weights

        return from_weights(args, weights, dtype=torch.float32, device="cpu", prefill_step_size=prefill_step_size)
    import mlx.core as mx

    from specfill.backends.mlx.model import Model

    built = Model(args)
    built.load_weights([(name, mx.array(w)) for name, w in weights.items()], strict=True)
    mx.eval(built.parameters())
    return CausalLM(built, t.model.ops, prefill_step_size=prefill_step_size)


def variant(
    t: Tiny,
    *,
    n_layers: int | None = None,
    context: int | None = None,
    prefill_step_size: int | None = None,
    vocab_size: int | None = None,
) -> CausalLM:
    """A model with t's weights: its first n_layers blocks, another context length or prefill step
    (a separately loaded speculator in the tests); another vocabulary gets fresh random weights."""
    args = replace(
        t.args,
        num_hidden_layers=n_layers or t.args.num_hidden_layers,
        max_position_embeddings=context or t.args.max_position_embeddings,
    )
    weights = {
        k: v
        for k, v in t.weights.items()
        if not any(f".layers.{i}." in k for i in range(args.num_hidden_layers, t.args.num_hidden_layers))
    }
    if vocab_size is not None:
        from tests.fixtures import tiny_weights

        args = replace(args, vocab_size=vocab_size)
        weights = dict(tiny_weights(args))
    return build(t, args, weights, prefill_step_size or t.model.prefill_step_size)


def cache_fill(cache: Any) -> list[int]:
    """Tokens held per layer (core/ops.py's KVCache: one LayerCache per layer)."""
    return [layer.offset for layer in cache.layers]


def greedy(
    model: Any,
    ids: Sequence[int],
    max_tokens: int,
    method: PrefillMethod = PrefillMethod(),
    info: GenerationInfo | None = None,
    stop_ids: frozenset[int] = frozenset(),
    progress: Any = None,
) -> list[int]:
    return list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=SamplingConfig(),
            stop_ids=stop_ids,
            method=method,
            info=info if info is not None else GenerationInfo(),
            progress=progress,
        )
    )


def assert_logits_close(t: Tiny, ours: Any, want: np.ndarray, what: str) -> None:
    ours = ours if isinstance(ours, np.ndarray) else t.model.ops.to_numpy(ours)
    ours = np.asarray(ours, dtype=np.float32)
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} vs {want.shape}"
    err = float(np.abs(ours - want).max())
    assert err <= tolerance(want), f"{what}: max |diff| {err} > {tolerance(want)}"


def h2o_method(n_chunk: int, n_batch: int, local: int, heavy: int) -> PrefillMethod:
    """Seed 001's H2O in every layer (no dense tail, no dense layers)."""
    return PrefillMethod(
        "h2o",
        h2o=H2OConfig(chunk_size=n_chunk, batch_size=n_batch, local=local, heavy=heavy, dense_tail=0, layers="all"),
    )
