"""The mlx-lm side of the adapter tests (specfill.backends.mlx.adapted): an adapted CausalLM of an
mlx-lm model, mlx-lm's own forward and decoding to compare with, and the backend's expectations.

Tolerance: the adapter and mlx-lm both compute in float32 with the same MLX kernels, so their
logits agree to float32 rounding: observed exactly equal on every architecture here (MLX CPU).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specfill.backends.mlx import load
from specfill.backends.mlx.adapted import AdaptedModel, AdaptedOps, adapt
from specfill.backends.mlx.model import Model as OwnModel
from specfill.core.driver import CausalLM
from tests.adapters import mlx_table as table
from tests.adapters.mlx_archs import HONOURED, LATENT, MOE, REFUSED, TERMS, build, save_directory

__all__ = [
    "AdaptedModel",
    "HONOURED",
    "LATENT",
    "MOE",
    "OwnModel",
    "REFUSED",
    "TERMS",
    "build",
    "load",
    "save_directory",
    "table",
]

NAME, CLI_BACKEND = "mlx", "mlx"
# the refusal test's cases: H2O, the SpecPrefill speculator, and the main model under SpecPrefill
# with an honoured speculator (on the torch backend the main pass runs refused layers instead)
REFUSAL_NAMES = ("H2O", "speculator", "SpecPrefill")
# the CLI's refusal case: (architecture, its config, what the refused method says)
CLI_REFUSAL = (
    "stablelm",
    REFUSED["stablelm"][0],
    "H2O cannot run on stablelm: layer 0 (attention of an unknown layout)",
)
FAMILIES = {  # the families the project has model files for, as the own-family tests write them
    "llama": {},
    "mistral": dict(sliding_window=None),  # mlx-lm runs Mistral as Llama: windows only from layer_types
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": {},
    "gemma3_text": dict(
        query_pre_attn_scalar=16, sliding_window=8, rope_local_base_freq=10000.0, num_hidden_layers=6
    ),  # mlx-lm reads the 6th layer's cache for its global mask
}


def adapted(lm: nn.Module, prefill_step_size: int = 2048) -> CausalLM:
    """The mlx-lm model `lm` adapted in place, as specfill's CausalLM on MLX's CPU."""
    return CausalLM(adapt(lm), AdaptedOps(mx.Device(mx.cpu)), prefill_step_size=prefill_step_size)


def to_numpy(a: mx.array) -> np.ndarray:
    return np.array(a)


def own_logits(lm: nn.Module, ids: list[int]) -> np.ndarray:
    """mlx-lm's own forward, every position's logits [T, vocab]."""
    return np.array(lm(mx.array(ids)[None])[0])


def own_greedy(lm: nn.Module, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens from mlx-lm's own model and its own prompt cache."""
    cache = make_prompt_cache(lm)
    logits = lm(mx.array(ids)[None], cache=cache)[0, -1]
    tokens = []
    for _ in range(max_tokens):
        tokens.append(int(mx.argmax(logits).item()))
        logits = lm(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens


def library_pair(directory) -> tuple:
    """The (model, tokenizer) pair mlx-lm loads from a directory."""
    return mlx_lm.load(str(directory))
