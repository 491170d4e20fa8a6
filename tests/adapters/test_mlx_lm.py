"""What only the mlx-lm adapter has: positions rotated inside mlx-lm's own attention, mlx-lm's
4-bit directories, the model left usable as mlx-lm's, and the one-way
rule between specfill's MLX model and the adapted one (a speculator or draft model runs through
the main model's ops)."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from specfill.backends.mlx import load
from specfill.core.errors import ModelLoadError
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.adapters.mlx_archs import HONOURED, build, save_directory
from tests.adapters.mlx_backend import FAMILIES, adapted
from tests.adapters.support import assert_close, greedy, prompt, spec


@pytest.mark.parametrize("arch", sorted(HONOURED))
def test_per_token_positions_rotate_each_token_at_its_own_position(arch):
    """SpecPrefill's original positions: q and k of a step at gapped per-token positions equal each
    token projected alone at its position (mlx-lm's own offset path), layer by layer."""
    model = adapted(build(arch))
    x = mx.random.normal((1, 6, 64), key=mx.random.key(5))
    positions = np.array([0, 1, 3, 6, 7, 19])
    for layer in model.model.lm.layers:
        attention = layer.self_attn
        q, k, v = attention.project(x, positions)
        for t, position in enumerate(positions.tolist()):
            q_t, k_t, v_t = attention.project(x[:, t : t + 1], position)
            for got, want, name in ((q, q_t, "q"), (k, k_t, "k"), (v, v_t, "v")):
                assert_close(np.array(got[:, :, t : t + 1]), np.array(want), f"{arch} {name} at {position}")
        if attention.layout.rope:  # RoPE really turns q: position 19 differs from position 0
            assert np.abs(np.array(attention.project(x[:, :1], 19)[0] - q[:, :, :1])).max() > 1e-3


def test_the_adapted_model_still_runs_as_mlx_lm_outside_specfill():
    lm = build("qwen3_moe")
    ids = mx.array(prompt(10, seed=4))[None]
    want = np.array(lm(ids))
    adapted(lm)
    np.testing.assert_array_equal(np.array(lm(ids)), want)
    adapted(lm)  # adapting twice keeps one adapter around the original module
    assert type(lm.layers[0].self_attn.inner).__name__ == "Attention"


# latent attention's per-head projections quantize along qk_nope and kv_lora_rank: 32 wide, one group
LATENT_4BIT = dict(HONOURED["deepseek_v3"], kv_lora_rank=32, qk_nope_head_dim=32)


@pytest.mark.parametrize("arch,config", [("qwen3_moe", None), ("phi3", None), ("deepseek_v3", LATENT_4BIT)])
def test_a_4bit_mlx_lm_directory_loads_quantized_and_equals_mlx_lm(arch, config, tmp_path):
    """mlx-community models are mostly 4-bit: the directory loads through mlx-lm's own reader, its
    layers stay quantized, and the adapter computes what mlx-lm computes on them."""
    directory = save_directory(arch, tmp_path / arch, config, bits=4)
    model, tokenizer = load(directory, device="cpu")
    lm, _ = mlx_lm.load(str(directory))
    ids = prompt(30, seed=6)
    want = np.array(lm(mx.array(ids)[None])[0])
    assert model.ops.quantized and tokenizer.vocab_size == 320
    assert_close(model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo()), want, f"{arch} 4-bit")


def test_a_pair_that_is_not_mlx_lm_s_is_one_load_error():
    lm = build("qwen3_moe")
    with pytest.raises(ModelLoadError, match="cannot find the directory the tokenizer"):
        load((lm, object()), device="cpu")


def test_an_own_model_speculates_for_the_adapted_model_as_for_the_own_model(tmp_path):
    """One speculator for both main-model paths (the speed bench compares their SpecPrefill): a
    specfill model run by the adapted model's ops keeps the same positions and gives the same
    tokens as under the own main model."""
    directory = save_directory("qwen2", tmp_path / "qwen2", FAMILIES["qwen2"])
    own, _ = load(directory, dtype="float32", device="cpu")
    ours, _ = load(mlx_lm.load(str(directory)), dtype="float32", device="cpu")
    method = replace(spec(0.3), speculator=own)
    ids = prompt(44, seed=5)
    infos = GenerationInfo(), GenerationInfo()
    assert greedy(ours, ids, 6, method, infos[0]) == greedy(own, ids, 6, method, infos[1])
    assert infos[0].kept_positions == infos[1].kept_positions and 8 <= infos[0].kept_tokens < 44


def test_an_adapted_speculator_for_an_own_main_model_is_refused_by_name(tmp_path):
    """The other way round the own model's ops cannot run mlx-lm's model: one ConfigError naming
    both ops and the way out, for a speculator and for a draft model, before anything runs."""
    from specfill.core.errors import ConfigError
    from specfill.core.runtime import Drafting, SamplingConfig

    directory = save_directory("qwen2", tmp_path / "qwen2", FAMILIES["qwen2"])
    own, _ = load(directory, dtype="float32", device="cpu")
    ours, _ = load(mlx_lm.load(str(directory)), dtype="float32", device="cpu")
    ids = prompt(44, seed=5)
    with pytest.raises(ConfigError, match="the speculator runs through AdaptedOps, which the main model's MLXOps"):
        greedy(own, ids, 4, replace(spec(0.3), speculator=ours))
    with pytest.raises(ConfigError, match="the draft model runs through AdaptedOps"):
        list(
            own.generate_step(
                ids,
                max_tokens=4,
                sampling=SamplingConfig(),
                stop_ids=frozenset(),
                method=PrefillMethod(),
                info=GenerationInfo(),
                drafting=Drafting(ours, 2),
            )
        )
