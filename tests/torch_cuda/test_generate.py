"""Seeded sampling, the CausalLM contract and its errors on a tiny random model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import from_weights, resolve_device, resolve_dtype
from specfill.core.driver import CausalLM
from specfill.core.errors import BackendUnavailableError, ConfigError, ModelLoadError, PromptTooLongError
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

GREEDY = SamplingConfig()


def run(
    model: CausalLM,
    ids: list[int],
    max_tokens: int,
    *,
    sampling: SamplingConfig = GREEDY,
    stop_ids: frozenset[int] = frozenset(),
    info: GenerationInfo | None = None,
) -> list[int]:
    return list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            method=PrefillMethod(),
            info=info or GenerationInfo(),
        )
    )


def test_is_a_causal_lm_and_accepts_lists_and_tensors():
    model = make_tiny("llama").ours()
    assert isinstance(model, CausalLM) and model.backend == "cuda"
    ids = prompt_ids(10)
    from_list = model(ids)
    torch.testing.assert_close(model(torch.tensor(ids)), from_list, rtol=0, atol=0)
    torch.testing.assert_close(model(torch.tensor([ids])), from_list, rtol=0, atol=0)
    assert model.peak_memory_gb() > 0


def test_generate_step_is_greedy_reports_info_and_stops_on_eos():
    model = make_tiny("qwen3", seed=7).ours()
    ids = prompt_ids(20, seed=7)
    info = GenerationInfo()
    tokens = run(model, ids, 10, info=info)
    assert len(tokens) == 10 and info.prompt_tokens == 20 and info.kept_tokens == 20
    assert tokens[0] == int(model(ids)[0, -1].argmax())
    stop_at = 3 + next(i for i, t in enumerate(tokens[3:]) if t not in tokens[:3])
    assert run(model, ids, 10, stop_ids=frozenset({tokens[stop_at]})) == tokens[: stop_at + 1]
    assert run(model, ids, 0) == []


def test_seeded_sampling_repeats_and_differs_across_seeds():
    model = make_tiny("llama", seed=8).ours()
    ids = prompt_ids(12, seed=8)
    hot = [SamplingConfig(temperature=1.5, top_p=0.95, seed=s) for s in (1, 1, 2)]
    first, again, other = (run(model, ids, 16, sampling=s) for s in hot)
    assert first == again and first != other


def test_prompt_too_long_names_the_numbers():
    model = make_tiny("llama").ours()  # max_position_embeddings 256
    with pytest.raises(
        PromptTooLongError, match="prompt of 250 tokens plus max_tokens 10 exceeds the model's context of 256 tokens"
    ):
        run(model, prompt_ids(250), 10)
    with pytest.raises(PromptTooLongError, match="257 tokens"):
        model(prompt_ids(257))


@pytest.mark.parametrize(
    "ids,match",
    [
        ([], "non-empty"),
        ([[1, 2], [3, 4]], "batch 1"),
        ([1, 128], "token id 128 is outside the vocabulary"),
        ([-1, 3], "token id -1"),
        ([1.5, 2.0], "integers"),
    ],
)
def test_bad_token_ids(ids, match):
    model = make_tiny("llama").ours()
    with pytest.raises(ConfigError, match=match):
        model(ids)


def test_bad_weights_are_load_errors():
    tiny = make_tiny("qwen2")

    def load(weights):
        return from_weights(tiny.args, weights, dtype=torch.float32, device="cpu")

    missing = {k: v for k, v in tiny.weights.items() if k != "model.layers.1.self_attn.k_proj.bias"}
    with pytest.raises(ModelLoadError, match="missing 1 tensors: model.layers.1.self_attn.k_proj.bias"):
        load(missing)
    wrong = {**tiny.weights, "model.norm.weight": np.ones(63, dtype=np.float32)}
    with pytest.raises(ModelLoadError, match=r"model.norm.weight in the weights has shape \(63,\)"):
        load(wrong)
    extra = {**tiny.weights, "model.layers.0.mlp.up_proj.bias": np.ones(96, dtype=np.float32)}
    with pytest.raises(ModelLoadError, match="does not use"):
        load(extra)


def test_device_and_dtype_resolution(monkeypatch):
    """With no dtype: bfloat16 on a CPU with fast bf16 matmuls (AVX-512 BF16 or AMX), float32 on any
    other (core/cpu.py); a named dtype is taken as given."""
    import specfill.backends.torch_cuda.loader as loader

    cpu = resolve_device("cpu")
    for fast, default in ((False, torch.float32), (True, torch.bfloat16)):
        monkeypatch.setattr(loader, "has_fast_bf16", lambda fast=fast: fast)
        assert resolve_dtype(None, cpu) == default
    assert resolve_dtype("bf16", cpu) == torch.bfloat16 and resolve_dtype(torch.float16, cpu) == torch.float16
    with pytest.raises(ConfigError, match="unsupported dtype 'int8'"):
        resolve_dtype("int8", cpu)
    with pytest.raises(ConfigError, match="unknown torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        assert resolve_device(None) == cpu
        with pytest.raises(BackendUnavailableError, match="sees no CUDA GPU"):
            resolve_device("cuda")
    else:
        assert resolve_device(None).type == "cuda" and resolve_dtype(None, resolve_device(None)) == torch.bfloat16


def test_a_commands_threads_follow_the_machine_and_threads_overrides(monkeypatch):
    """Inside a command with no --threads a CPU load computes on this process's physical cores
    (core/cpu.py, the one place that decides); --threads overrides it; the statistics' Compute line
    says how many ran; outside a command (the library) torch's own setting stands."""
    from specfill import api
    from specfill.core import cpu

    before = torch.get_num_threads()
    monkeypatch.setattr(cpu, "physical_cores", lambda: 3)
    try:
        torch.set_num_threads(1)
        with cpu.command_threads(None) as threads:
            model, tokenizer = api.load("random:tiny-llama", backend="cuda", device="cpu", dtype="float32")
            assert threads == 3 and torch.get_num_threads() == 3
            last = list(api.stream_generate(model, tokenizer, [1, 2, 3], max_tokens=1))[-1]
            assert "Compute: cpu, float32, 3 threads" in api.format_stats(last)
        with cpu.command_threads(2):
            api.load("random:tiny-llama", backend="cuda", device="cpu", dtype="float32")
            assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        api.load("random:tiny-llama", backend="cuda", device="cpu", dtype="float32")
        assert cpu.compute_threads() is None and torch.get_num_threads() == 1
        with pytest.raises(ConfigError, match="--threads must be >= 1"):
            with cpu.command_threads(0):
                pass
    finally:
        torch.set_num_threads(before)


def test_physical_cores_counts_cores_not_hyperthreads():
    import os

    from specfill.core.cpu import physical_cores

    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))


def test_progress_is_reported_after_each_prefill_step():
    model = make_tiny("qwen2", seed=12).ours(step=8)
    seen = []
    tokens = list(
        model.generate_step(
            prompt_ids(20, seed=12),
            max_tokens=2,
            sampling=GREEDY,
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
            progress=lambda done, total: seen.append((done, total)),
        )
    )
    assert seen == [(8, 20), (16, 20), (20, 20)] and len(tokens) == 2
