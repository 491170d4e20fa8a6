"""Tiny GGUF and safetensors checkpoints on disk -> our torch model, against transformers
loading the same values (the fixtures write identical values to both formats)."""

from __future__ import annotations

import pytest
import torch
import transformers

from specfill.backends.torch_cuda import from_weights
from specfill.core.io.weights import load_weights
from tests.torch_cuda.tiny_torch_models import prompt_ids

CASES = [
    ("llama", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("llama", {"llama3_rope": True}),
    ("qwen3", {"tie_word_embeddings": True}),
]


def transformers_logits(directory, ids: list[int]) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    with torch.no_grad():
        return hf.eval()(torch.tensor([ids]), use_cache=False).logits


@pytest.mark.parametrize("arch,options", CASES)
def test_gguf_and_safetensors_match_transformers(tiny_checkpoint, arch, options):
    directory = tiny_checkpoint(arch, "safetensors", **options)
    args, _ = load_weights(directory)
    ids = prompt_ids(64, vocab=args.vocab_size, seed=9)
    expected = transformers_logits(directory, ids)
    assert expected.abs().max() > 0.1  # not a degenerate model
    for fmt in ("gguf", "safetensors"):
        args, weights = load_weights(tiny_checkpoint(arch, fmt, **options))
        model = from_weights(args, weights, dtype=torch.float32, device="cpu", prefill_step_size=24)
        assert (model(ids) - expected).abs().max().item() <= 1e-4, fmt
