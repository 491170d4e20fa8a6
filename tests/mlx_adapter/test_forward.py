"""Full prefill and decoding through the adapter equal mlx-lm's own model (fp32, MLX CPU)."""
from __future__ import annotations

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from specfill.backends.mlx import load
from specfill.core.adapted import AdaptedArgs
from specfill.core.errors import ModelLoadError
from specfill.core.runtime import GenerationInfo, PrefillMethod

from tests.mlx_adapter.archs import HONOURED, MOE, REFUSED, build, save_directory
from tests.mlx_adapter.support import adapted, assert_close, greedy, prompt

ALL = sorted(HONOURED) + sorted(REFUSED)


def test_the_set_covers_twelve_architectures_and_four_mixtures_of_experts():
    assert len(HONOURED) >= 12 and len([a for a in MOE if a in HONOURED]) >= 4


@pytest.mark.parametrize("arch", ALL)
def test_full_prefill_equals_mlx_lm_forward(arch):
    """Every position's logits, in two prefill steps (the second step attends to the cache), over a
    prompt longer than the sliding windows (8) of gemma3_text / exaone4."""
    lm = build(arch)
    ids = prompt(40, seed=1)
    want = np.array(lm(mx.array(ids)[None])[0])
    model = adapted(lm, prefill_step_size=24)
    assert isinstance(model.args, AdaptedArgs) and model.args.num_hidden_layers == 2
    got = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert_close(got, want, f"{arch} prefill")


@pytest.mark.parametrize("arch", ALL)
def test_greedy_decoding_equals_mlx_lm_with_its_own_cache(arch):
    lm = build(arch)
    ids = prompt(20, seed=2)
    cache = make_prompt_cache(lm)
    logits = lm(mx.array(ids)[None], cache=cache)[0, -1]
    want = []
    for _ in range(6):
        want.append(int(mx.argmax(logits).item()))
        logits = lm(mx.array([[want[-1]]]), cache=cache)[0, -1]
    model = adapted(lm)
    assert greedy(model, ids, 6) == want


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
            q_t, k_t, v_t = attention.project(x[:, t:t + 1], position)
            for got, want, name in ((q, q_t, "q"), (k, k_t, "k"), (v, v_t, "v")):
                assert_close(np.array(got[:, :, t:t + 1]), np.array(want), f"{arch} {name} at {position}")
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


@pytest.mark.parametrize("arch", ["qwen3_moe", "phi3"])
def test_a_4bit_mlx_lm_directory_loads_quantized_and_equals_mlx_lm(arch, tmp_path):
    """mlx-community models are mostly 4-bit: the directory loads through mlx-lm's own reader, its
    layers stay quantized, and the adapter computes what mlx-lm computes on them."""
    directory = save_directory(arch, tmp_path / arch, bits=4)
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
