"""Random-weight models of public checkpoints' shapes, for benchmarks where no checkpoint can
travel (a GPU machine without network): `load("random:llama-1b")` on either backend.

The weights are seeded normal draws (std 0.02, norms 1), so timings match the real model's shape
while the text is noise. Their tokenizer (core.io.tokenizer.id_tokenizer) maps the text "17 4 96"
to the ids [17, 4, 96] and back. This module imports neither the weights nor the tokenizer module:
both import it.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..models import ModelArgs, expected_tensor_shapes

PREFIX = "random:"

# config.json values of public checkpoints (no download needed): a Shape each, and the keys a
# Shape leaves out (head_dim None: hidden_size / num_attention_heads, as config.json without one)
Shape = namedtuple(
    "Shape",
    "model_type vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads"
    " num_key_value_heads head_dim rope_theta max_position_embeddings tie_word_embeddings",
)


def _config(shape: Shape, **more: Any) -> dict[str, Any]:
    """The config.json dictionary of `shape` (its None values left out), with `more` keys."""
    return {key: value for key, value in shape._asdict().items() if value is not None} | more


def _llama3(factor: float) -> dict[str, Any]:
    """Llama 3.1's config.json keys beyond its Shape: its norm epsilon and RoPE scaling by `factor`."""
    scaling = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    return {"rms_norm_eps": 1e-5, "rope_scaling": {"rope_type": "llama3", "factor": factor, **scaling}}


RANDOM_SHAPES: dict[str, dict[str, Any]] = {
    "tiny-llama": _config(Shape("llama", 512, 64, 128, 2, 4, 2, None, 10000.0, 4096, True)),
    # long context on a small budget: `specfill doctor`'s micro-bench (4K and 16K tokens in seconds)
    "tiny-llama-32k": _config(Shape("llama", 512, 128, 256, 2, 2, 1, 64, 1000000.0, 32768, True)),
    "smollm2-135m": _config(Shape("llama", 49152, 576, 1536, 30, 9, 3, None, 100000.0, 8192, True)),
    "llama-1b": _config(Shape("llama", 128256, 2048, 8192, 16, 32, 8, 64, 500000.0, 131072, True), **_llama3(32.0)),
    # Llama-3.1-8B (GPU benchmarks, with llama-1b as its speculator: the same vocabulary and id
    # tokenizer); on a GPU the torch backend draws these weights there (16 GB in bfloat16)
    "llama-8b": _config(Shape("llama", 128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 131072, False), **_llama3(8.0)),
    "qwen2-0.5b": _config(Shape("qwen2", 151936, 896, 4864, 24, 14, 2, None, 1000000.0, 32768, True)),
    "qwen3-0.6b": _config(Shape("qwen3", 151936, 1024, 3072, 28, 16, 8, 128, 1000000.0, 40960, True)),
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
