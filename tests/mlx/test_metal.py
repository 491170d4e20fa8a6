"""On Apple silicon: the runtime on the Metal GPU agrees with MLX's CPU backend (skipped where
MLX has no Metal back-end, as on Linux)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx import load
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.mlx.conftest import prompt_ids

pytestmark = pytest.mark.skipif(not mx.metal.is_available(), reason="needs Apple silicon with MLX's Metal back-end")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gpu_logits_match_cpu(tiny_checkpoint, arch):
    path = tiny_checkpoint(arch, "gguf")
    reference, _ = load(path, dtype="float32", device="cpu")
    ids = prompt_ids(48, vocab=reference.args.vocab_size, seed=31)
    expected = np.asarray(reference(ids)[0])
    gpu32, _ = load(path, dtype="float32", device="gpu")
    assert np.abs(np.asarray(gpu32(ids)[0]) - expected).max() <= 1e-3
    native, _ = load(path, device="gpu")  # quantized layers kept, float16 activations
    assert native.ops.quantized and native.dtype == mx.float16
    logits = np.asarray(native(ids)[0])
    assert np.abs(logits - expected).max() <= 0.1
    assert (logits.argmax(-1) == expected.argmax(-1)).mean() >= 0.9


def test_gpu_generates_and_reports_memory(tiny_checkpoint):
    model, _ = load(tiny_checkpoint("qwen3", "gguf"), device="gpu")
    ids = prompt_ids(20, vocab=model.args.vocab_size, seed=32)
    tokens = list(
        model.generate_step(
            ids,
            max_tokens=5,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )
    )
    assert len(tokens) == 5 and all(0 <= t < model.args.vocab_size for t in tokens)
    assert model.peak_memory_gb() > 0.0
