"""Mistral and Gemma 3 on MLX: the same tiny transformers models as tests/torch_cuda's, their
weights built into our MLX model (sliding windows over positions, Gemma 3's layer kinds)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx.loader import build_model
from specfill.backends.mlx.ops import MLXOps
from specfill.backends.mlx.weights import Checkpoint
from specfill.core.driver import CausalLM
from specfill.core.methods.prefill import prefill
from specfill.core.reference.model import ReferenceModel
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

FAMILIES = ["mistral", "gemma3"]


def mlx_model(tiny, step: int = 2048) -> CausalLM:
    arrays = {name: mx.array(w) for name, w in tiny.weights.items()}
    return CausalLM(build_model(Checkpoint(tiny.args, arrays, {}, "tiny")), MLXOps(mx.cpu), prefill_step_size=step)


@pytest.mark.parametrize("arch", FAMILIES)
def test_logits_match_transformers_past_the_window(arch):
    tiny = make_tiny(arch, seed=1)
    ids = prompt_ids(48, seed=1)
    assert np.abs(np.asarray(mlx_model(tiny)(ids)) - tiny.hf_logits(ids).numpy()).max() <= 1e-4


@pytest.mark.parametrize("arch", FAMILIES)
def test_window_counts_original_positions_in_a_sparse_cache(arch):
    tiny = make_tiny(arch, seed=3)
    ids = prompt_ids(12, seed=3)
    positions = [0, 1, 3, 6, 7, 9, 12, 15, 16, 20, 21, 30]
    reference = ReferenceModel(tiny.args, tiny.weights).forward(ids, positions)
    model = mlx_model(tiny)
    ops = model.ops
    cache = ops.new_cache(model.model, 16)
    kept = prefill(
        ops, model.model, ops.tokens(np.array(ids[:11])), np.array(positions[:11]), cache, step_size=4, logits_from=0
    )
    decoded = ops.forward(model.model, ops.tokens(np.array([ids[11]])), 30, cache, None, 0)[-1]
    assert np.abs(np.asarray(kept) - reference[:11]).max() <= 1e-4
    assert np.abs(np.asarray(decoded) - reference[11]).max() <= 1e-4


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_decode_past_the_window_matches_transformers_generate(arch):
    tiny = make_tiny(arch, seed=5)
    ids = prompt_ids(13, seed=5)
    tokens = list(
        mlx_model(tiny, step=4).generate_step(
            ids,
            max_tokens=10,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )
    )
    assert tokens == tiny.hf_greedy(ids, 10)
