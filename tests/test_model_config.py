"""Family details read from config.json and GGUF metadata: windows, Gemma 3's layer pattern,
local RoPE base and query scale, and one clear error for each variant that is not supported."""

from __future__ import annotations

import pytest

from specfill.core.errors import ModelLoadError
from specfill.core.io.weights import gguf_to_hf_name
from specfill.core.models import ModelArgs

BASE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=7,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
)
GEMMA3 = dict(
    BASE,
    model_type="gemma3_text",
    sliding_window=512,
    query_pre_attn_scalar=16,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
    },
)


def test_mistral_window_is_read_and_llama_has_none():
    mistral = ModelArgs.from_hf_config(dict(BASE, model_type="mistral", sliding_window=4096))
    assert mistral.architecture == "llama" and [mistral.layer_window(i) for i in (0, 6)] == [4096, 4096]
    assert ModelArgs.from_hf_config(dict(BASE, model_type="mistral", sliding_window=None)).layer_window(0) is None
    assert ModelArgs.from_hf_config(dict(BASE, model_type="llama", sliding_window=4096)).layer_window(0) is None


def test_gemma3_config_one_global_layer_in_six():
    args = ModelArgs.from_hf_config(GEMMA3)
    assert [args.layer_window(i) is None for i in range(7)] == [False] * 5 + [True, False]
    assert (args.rope_theta, args.rope_local_theta, args.attention_scale) == (1e6, 1e4, 0.25)
    assert args.tie_word_embeddings and args.qk_norm and args.sandwich_norms
    old_style = ModelArgs.from_hf_config(
        dict(BASE, model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=5000.0, sliding_window_pattern=3)
    )
    assert (old_style.rope_local_theta, old_style.global_every) == (5000.0, 3)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"final_logit_softcapping": 30.0}, "soft-capping is not supported"),
        (
            {"layer_types": ["sliding_attention"] + ["full_attention"] * 2 + ["sliding_attention"] * 4},
            "not one global layer every n layers",
        ),
        ({"hidden_activation": "gelu"}, "gelu_pytorch_tanh only"),
        ({"model_type": "gemma3"}, "text-only Gemma3ForCausalLM"),
    ],
)
def test_unsupported_gemma3_variants_are_one_clear_error(change, message):
    with pytest.raises(ModelLoadError, match=message):
        ModelArgs.from_hf_config(dict(GEMMA3, **change))


def test_qwen2_sliding_window_switch_is_refused():
    with pytest.raises(ModelLoadError, match="Qwen2's sliding window is not supported"):
        ModelArgs.from_hf_config(dict(BASE, model_type="qwen2", use_sliding_window=True, sliding_window=64))


def test_gemma3_gguf_metadata_and_names():
    meta = {
        "general.architecture": "gemma3",
        "gemma3.embedding_length": 640,
        "gemma3.block_count": 18,
        "gemma3.feed_forward_length": 2048,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.attention.sliding_window": 512,
        "gemma3.context_length": 32768,
        "gemma3.vocab_size": 262144,
    }
    args = ModelArgs.from_gguf_metadata(meta, has_output_weight=False)
    assert (args.sliding_window, args.global_every, args.rope_local_theta) == (512, 6, 10000.0)
    assert args.attention_scale == 256**-0.5 and args.layer_window(5) is None and args.layer_window(6) == 512
    assert gguf_to_hf_name("blk.2.ffn_norm.weight", "gemma3") == "model.layers.2.pre_feedforward_layernorm.weight"
    assert gguf_to_hf_name("blk.2.post_ffw_norm.weight", "gemma3") == "model.layers.2.post_feedforward_layernorm.weight"
    assert gguf_to_hf_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    with pytest.raises(ModelLoadError, match="sliding window on a llama GGUF"):
        ModelArgs.from_gguf_metadata(
            {**{k.replace("gemma3", "llama"): v for k, v in meta.items()}, "general.architecture": "llama"},
            has_output_weight=False,
        )


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": ["gemma3_text"]},
        {"model_type": {"a": 1}},
        {"rope_parameters": {"sliding_attention": [1], "full_attention": {}}},
        {"layer_types": "sliding_attention"},
        {"sliding_window": "512"},
        {"query_pre_attn_scalar": -1},
        {"rope_local_base_freq": [1]},
    ],
)
def test_hostile_family_values_are_one_clear_error(change):
    with pytest.raises(ModelLoadError):
        ModelArgs.from_hf_config(dict(GEMMA3, **change))
