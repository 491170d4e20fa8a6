"""Tiny GGUF, safetensors and mlx-lm checkpoints on disk -> our MLX model, against transformers
loading the same values (the fixtures write identical values to both formats)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from specfill.backends import torch_cuda
from specfill.backends.mlx import load
from tests.fixtures import tiny_model_args
from tests.mlx.conftest import prompt_ids

CASES = [
    ("llama", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("llama", {"llama3_rope": True}),
    ("qwen3", {"tie_word_embeddings": True}),
]


def max_diff(a: mx.array | np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - b).max())


@pytest.mark.parametrize("arch,options", CASES)
def test_fp32_gguf_and_safetensors_match_transformers_and_torch(tiny_checkpoint, transformers_logits, arch, options):
    directory = tiny_checkpoint(arch, "safetensors", **options)
    args = tiny_model_args(arch, **options)
    ids = prompt_ids(64, vocab=args.vocab_size, seed=9)
    expected = transformers_logits(directory, ids)
    assert np.abs(expected).max() > 0.1  # not a degenerate model
    for fmt in ("gguf", "safetensors"):
        path = tiny_checkpoint(arch, fmt, **options)
        model, _ = load(path, dtype="float32", device="cpu", prefill_step_size=24)
        assert model.args == args, fmt
        assert not model.ops.quantized
        logits = model(ids)
        assert logits.shape == (1, 64, args.vocab_size) and logits.dtype == mx.float32
        assert max_diff(logits[0], expected) <= 1e-4, fmt
        torch_model, _ = torch_cuda.load(path, dtype="float32", device="cpu")
        assert max_diff(logits, torch_model(ids).numpy()) <= 1e-4, fmt


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("quant,bits", [("Q8_0", 8), ("Q4_0", 4), ("Q4_1", 4), ("Q5_0", 5), ("Q5_1", 5)])
def test_quantized_gguf_stays_quantized_and_matches(tiny_checkpoint, transformers_logits, arch, quant, bits):
    """Q/K of llama GGUFs are row-permuted: the packed weight, scales and biases are un-permuted
    alike, so the quantized model equals transformers on the dequantized values."""
    model, _ = load(tiny_checkpoint(arch, "gguf", quant=quant), device="cpu")
    q_proj = model.model.layers[1].self_attn.q_proj
    assert model.ops.quantized and isinstance(q_proj, nn.QuantizedLinear)
    assert (q_proj.bits, q_proj.group_size) == (bits, 32)
    assert isinstance(model.model.layers[1].mlp.up_proj, nn.Linear)  # stored F32 by the fixture
    ids = prompt_ids(40, vocab=model.args.vocab_size, seed=3)
    expected = transformers_logits(tiny_checkpoint(arch, "safetensors", quant=quant), ids)
    assert max_diff(model(ids)[0], expected) <= 1e-4


@pytest.mark.parametrize("quant", ["BF16", "F16"])
def test_float_gguf_types_give_plain_layers(tiny_checkpoint, transformers_logits, quant):
    """F16 / BF16 matrices are read as floats: plain layers, matching transformers."""
    model, _ = load(tiny_checkpoint("llama", "gguf", quant=quant), device="cpu")
    assert not model.ops.quantized
    ids = prompt_ids(24, vocab=model.args.vocab_size, seed=6)
    expected = transformers_logits(tiny_checkpoint("llama", "safetensors", quant=quant), ids)
    assert max_diff(model(ids)[0], expected) <= 1e-4


def test_dequantize_option_gives_plain_layers_in_the_requested_dtype(tiny_checkpoint):
    path = tiny_checkpoint("llama", "gguf", quant="Q4_1")
    model, _ = load(path, dtype="float16", device="cpu")
    q_proj = model.model.layers[0].self_attn.q_proj
    assert not model.ops.quantized and type(q_proj) is nn.Linear
    assert q_proj.weight.dtype == mx.float16 and model.dtype == mx.float16
    quantized, _ = load(path, device="cpu")
    ids = prompt_ids(12, vocab=model.args.vocab_size, seed=4)
    assert max_diff(model(ids), np.asarray(quantized(ids))) <= 5e-2  # float16 rounding only


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_mlx_lm_quantized_directory_matches_mlx_lm(tiny_checkpoint, tmp_path, arch):
    """A directory written by mlx_lm.convert (4-bit, group 32, embeddings quantized too) loads
    with its quantization and gives mlx-lm's own logits."""
    from mlx_lm import convert
    from mlx_lm.utils import load_model

    converted = tmp_path / "mlx-q4"
    convert(
        str(tiny_checkpoint(arch, "safetensors")), mlx_path=str(converted), quantize=True, q_group_size=32, q_bits=4
    )
    model, _ = load(converted, device="cpu")
    assert model.ops.quantized
    assert isinstance(model.model.model.embed_tokens, nn.QuantizedEmbedding)
    assert model.model.layers[0].mlp.down_proj.bits == 4
    reference, _ = load_model(converted)
    ids = prompt_ids(32, vocab=model.args.vocab_size, seed=5)
    expected = np.asarray(reference(mx.array([ids])).astype(mx.float32))[0]
    assert max_diff(model(ids)[0], expected) <= 1e-4
