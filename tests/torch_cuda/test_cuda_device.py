"""The same model on a CUDA GPU (skipped where torch sees none): fp32 parity with transformers on
CPU, the lower-right causal path of multi-step prefill, greedy decode, bf16 sanity, memory."""

from __future__ import annotations

import pytest
import torch

from specfill.backends.torch_cuda import from_weights
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")


def on_cuda(tiny, dtype=torch.float32, step=2048):
    return from_weights(tiny.args, tiny.weights, dtype=dtype, device="cuda", prefill_step_size=step)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("step", [2048, 16])
def test_cuda_fp32_matches_transformers(arch, step):
    tiny = make_tiny(arch, seed=13)
    ids = prompt_ids(70, seed=13)
    logits = on_cuda(tiny, step=step)(ids)
    assert logits.device.type == "cuda"
    assert (logits.cpu() - tiny.hf_logits(ids)).abs().max().item() <= 1e-4


def test_cuda_greedy_is_step_independent_and_reports_memory():
    tiny = make_tiny("qwen3", seed=14)
    ids = prompt_ids(50, seed=14)
    runs = []
    for step in (2048, 8):
        model = on_cuda(tiny, step=step)
        runs.append(
            list(
                model.generate_step(
                    ids,
                    max_tokens=8,
                    sampling=SamplingConfig(),
                    stop_ids=frozenset(),
                    method=PrefillMethod(),
                    info=GenerationInfo(),
                )
            )
        )
    assert runs[0] == runs[1] == tiny.hf_greedy(ids, 8)
    assert model.peak_memory_gb() > 0


def test_cuda_bf16_is_finite_and_close_to_fp32():
    tiny = make_tiny("llama", seed=15)
    ids = prompt_ids(60, seed=15)
    logits = on_cuda(tiny, dtype=torch.bfloat16, step=16)(ids).cpu()
    assert torch.isfinite(logits).all()
    assert (logits - tiny.hf_logits(ids)).abs().max().item() <= 0.25
