"""The torch model against transformers' own Llama / Qwen2 / Qwen3 with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.core.errors import ModelLoadError
from specfill.core.methods.prefill import prefill
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

ARCHS = ["llama", "qwen2", "qwen3"]
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 50000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, tie):
    tiny = make_tiny(arch, seed=1, tie_word_embeddings=tie)
    assert tiny.args.attention_bias == (arch == "qwen2") and tiny.args.qk_norm == (arch == "qwen3")
    ids = prompt_ids(48, seed=1)
    ours = tiny.ours()(ids)
    assert ours.shape == (1, 48, 128) and ours.dtype == torch.float32
    assert (ours - tiny.hf_logits(ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("rope", [LLAMA3_ROPE, {"rope_type": "linear", "rope_theta": 1000.0, "factor": 4.0}])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rope_scaling_matches_transformers(arch, rope):
    tiny = make_tiny(arch, seed=2, rope_parameters=rope)
    assert tiny.args.rope_theta == rope["rope_theta"]
    assert tiny.args.rope_scaling["rope_type"] == rope["rope_type"]
    ids = prompt_ids(160, seed=2)  # past llama3's original context of 32
    assert (tiny.ours()(ids) - tiny.hf_logits(ids)).abs().max().item() <= 1e-4


def test_unsupported_rope_scaling_is_a_load_error():
    tiny = make_tiny("llama")
    with pytest.raises(ModelLoadError, match="rope scaling type 'yarn' is not supported"):  # before any weight
        type(tiny.args)(**{**tiny.args.__dict__, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


@pytest.mark.parametrize("arch", ARCHS)
def test_non_contiguous_positions_then_decode(arch):
    """Kept tokens in slots 0..4 at their original positions, then a decode at position 10."""
    tiny = make_tiny(arch, seed=3)
    ids, positions = prompt_ids(6, seed=3), [0, 1, 3, 6, 7, 10]
    reference = tiny.hf_logits(ids, positions)[0]
    model = tiny.ours()
    ops = model.ops
    cache = ops.new_cache(model.model, 8)
    kept = prefill(
        ops, model.model, ops.tokens(np.array(ids[:5])), np.array(positions[:5]), cache, step_size=2048, logits_from=0
    )
    assert cache.filled == 5
    decoded = ops.forward(model.model, ops.tokens(np.array([ids[5]])), 10, cache, None, 0)[-1]
    assert (kept - reference[:5]).abs().max().item() <= 1e-4
    assert (decoded - reference[5]).abs().max().item() <= 1e-4
    # the positions matter: contiguous ones give different logits
    assert (tiny.hf_logits(ids)[0, 5] - reference[5]).abs().max().item() > 1e-2


@pytest.mark.parametrize("step", [1, 5, 16])
def test_prefill_in_steps_equals_one_step(step):
    tiny = make_tiny("qwen2", seed=4)
    ids = prompt_ids(37, seed=4)
    one_step = tiny.ours()(ids)
    stepped = tiny.ours(step=step)(ids)
    assert (stepped - one_step).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decode_matches_transformers_generate(arch):
    tiny = make_tiny(arch, seed=5)
    ids = prompt_ids(29, seed=5)
    expected = tiny.hf_greedy(ids, 12)
    for step in (2048, 8):  # one-step and multi-step prefill give the same tokens
        model = tiny.ours(step=step)
        tokens = list(
            model.generate_step(
                ids,
                max_tokens=12,
                sampling=SamplingConfig(),
                stop_ids=frozenset(),
                method=PrefillMethod(),
                info=GenerationInfo(),
            )
        )
        assert tokens == expected


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 0.25), (torch.float16, 0.05)])
def test_half_precision_runs_close_to_fp32(dtype, tolerance):
    tiny = make_tiny("qwen3", seed=6)
    ids = prompt_ids(40, seed=6)
    half = tiny.ours(dtype=dtype, step=16)
    assert half.model.embed_tokens.weight.dtype == dtype
    logits = half(ids)
    assert torch.isfinite(logits).all()
    assert (logits - tiny.hf_logits(ids)).abs().max().item() <= tolerance
