"""Random-weight models of public checkpoints' shapes, for benchmarks where no checkpoint can
travel (a GPU machine without network): `load("random:llama-1b")` on either backend.

The weights are seeded normal draws (std 0.02, norms 1), so timings match the real model's shape
while the text is noise. Their tokenizer (core.io.tokenizer.id_tokenizer) maps the text "17 4 96"
to the ids [17, 4, 96] and back. This module imports neither the weights nor the tokenizer module:
both import it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..models import ModelArgs, expected_tensor_shapes

PREFIX = "random:"

# config.json values of public checkpoints (no download needed)
RANDOM_SHAPES: dict[str, dict[str, Any]] = {
    "tiny-llama": dict(
        model_type="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    # long context on a small budget: `specfill doctor`'s micro-bench (4K and 16K tokens in seconds)
    "tiny-llama-32k": dict(
        model_type="llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
    "smollm2-135m": dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "llama-1b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    # Llama-3.1-8B (GPU benchmarks, with llama-1b as its speculator: the same vocabulary and id
    # tokenizer); on a GPU the torch backend draws these weights there (16 GB in bfloat16)
    "llama-8b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2-0.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    ),
}


def is_random_model(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def random_model_args(path: str) -> ModelArgs:
    """ModelArgs of "random:NAME"; an unknown NAME is a ModelLoadError listing the known ones."""
    name = path[len(PREFIX) :]
    if name not in RANDOM_SHAPES:
        raise ModelLoadError(
            f"unknown random-weight shape {name!r} (choose from {', '.join(PREFIX + n for n in RANDOM_SHAPES)})"
        )
    return ModelArgs.from_hf_config(RANDOM_SHAPES[name])


def random_weights(args: ModelArgs, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights: N(0, 0.02) matrices, norm weights 1, biases 0."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_tensor_shapes(args).items():
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
        elif name.endswith(".bias"):
            weights[name] = np.zeros(shape, dtype=np.float32)
        else:
            w = rng.standard_normal(shape, dtype=np.float32)
            w *= 0.02
            weights[name] = w
    return weights


def load_random_model(path: str, seed: int = 0) -> tuple[ModelArgs, dict[str, np.ndarray]]:
    args = random_model_args(path)
    return args, random_weights(args, seed)


def random_prompt_ids(vocab_size: int, n_tokens: int, seed: int = 0) -> list[int]:
    """A seeded prompt of uniformly drawn ids, for timing random-weight models."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=n_tokens).tolist()
