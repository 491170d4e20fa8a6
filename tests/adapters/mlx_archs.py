"""Tiny configs of mlx-lm architectures (2 layers, hidden 64, 4 query heads over 2 KV heads, head dim
16, vocabulary 320, the tiny tokenizer's) and the mlx-lm models built from them with seeded random weights.

HONOURED: the adapter runs every method on them (the project's own five families are not here:
they have model files of their own; test_own_families.py compares the two). MOE marks mixtures of
experts. REFUSED: architectures whose layers a sparse method cannot run, with the layer kind
named in the refusal (full prefill and decoding still work on them). HYBRID: recurrent layers beside
attention layers (test_mlx_hybrids.py builds them with four layers).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from tests.fixtures.tiny_tokenizer import tiny_bpe_tokenizer_json, tiny_tokenizer_config

BASE = dict(
    bos_token_id=1,
    eos_token_id=2,
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    vocab_size=320,
    max_position_embeddings=512,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
_MOE = dict(
    num_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    decoder_sparse_step=1,
    norm_topk_prob=True,
    mlp_only_layers=[],
)
_GRANITE = dict(
    embedding_multiplier=2.0,
    attention_multiplier=0.2,
    logits_scaling=4.0,
    residual_multiplier=0.5,
    attention_bias=False,
)

HONOURED: dict[str, dict[str, Any]] = {
    "qwen3_moe": _MOE,
    "mixtral": _MOE,
    "granitemoe": dict(_MOE, **_GRANITE),
    "olmoe": _MOE,
    "phimoe": dict(_MOE, rope_scaling=None),
    "phi3": {},  # fused qkv projection
    "olmo2": {},  # q/k RMSNorm over all heads at once
    "glm4": dict(partial_rotary_factor=0.5, attention_bias=True),  # RoPE on half of each head
    "starcoder2": dict(norm_epsilon=1e-5),  # biases, LayerNorm
    "exaone4": dict(rope_scaling=None, sliding_window=8, sliding_window_pattern="LG"),  # NoPE global layers
    "smollm3": dict(no_rope_layer_interval=2),  # NoPE layers
    "gemma3_text": dict(sliding_window=8, sliding_window_pattern=2, query_pre_attn_scalar=16),
    "granite": dict(_GRANITE, mlp_bias=False),
    "seed_oss": {},
    "llama4_text": dict(
        _MOE,
        interleave_moe_layer_step=1,
        no_rope_layers=[1, 0],
        use_qk_norm=True,
        attention_chunk_size=8,
        intermediate_size_mlp=128,
    ),  # q/k RMS without weight, NoPE
    "deepseek": dict(_MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, moe_layer_freq=1),
    "qwen2_moe": dict(_MOE, shared_expert_intermediate_size=32),
    "gemma": {},
    "glm": {},
    "cohere": dict(use_qk_norm=True, layer_norm_eps=1e-5, logit_scale=0.5),  # LayerNorm per head, [H, D] weight
    "internlm3": dict(bias=False, qkv_bias=False),
    "ernie4_5": dict(use_bias=False),
    "helium": dict(attention_bias=False, mlp_bias=False),
    "minicpm": dict(dim_model_base=32, scale_depth=1.4, scale_emb=12.0),
    "mimo": dict(num_nextn_predict_layers=0),
    "nemotron": dict(
        partial_rotary_factor=0.5, norm_eps=1e-5, hidden_act="relu2", mlp_bias=False, attention_bias=False
    ),
    "olmo3": dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]),  # olmo2's norms, slides
    "glm4_moe": dict(
        _MOE,
        n_routed_experts=4,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        rope_scaling=None,
        use_qk_norm=True,
        attention_bias=True,
        partial_rotary_factor=0.5,
    ),  # q/k RMSNorm per head, RoPE on half of each head
    "minimax": dict(_MOE, shared_intermediate_size=0, rotary_dim=8),  # MiniMax-M2 (mlx-lm's minimax: softmax
    # attention only): q/k RMSNorm over all heads at once, RoPE on half of each head
    # attention terms (core/stages.AttentionTerms): sinks (build() draws them N(0, 1), so that they
    # hold a real share of every softmax), a logit soft-cap low enough to bind at these logits (and
    # the LM head's own final soft-capping, the family's code)
    "gpt_oss": dict(_MOE, experts_per_token=2, sliding_window=8),  # slides: mlx-lm's masks
    "gemma2": dict(query_pre_attn_scalar=16, attn_logit_softcapping=2.0, final_logit_softcapping=30.0),
    # Gemma 4: an RMS norm on v before the cache, values from the key projection on the full layer
    # (attention_k_eq_v), a sliding and a full layer whose heads are twice as wide (global_head_dim,
    # its proportional RoPE on a quarter of them), per-layer inputs (test_mlx_gemma4.py also builds
    # the KV-shared layers)
    "gemma4_text": dict(
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        global_head_dim=32,
        attention_k_eq_v=True,
        num_kv_shared_layers=0,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=320,
    ),
    # multi-head latent attention: keys of qk_nope + qk_rope = 24 dims, values of v_head_dim = 16
    "deepseek_v3": dict(
        _MOE,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        n_shared_experts=1,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        routed_scaling_factor=1.0,
        topk_method="noaux_tc",
        n_group=1,
        topk_group=1,
    ),
}
MOE = (
    "deepseek_v3",
    "kimi_k25",
    "qwen3_moe",
    "mixtral",
    "granitemoe",
    "olmoe",
    "phimoe",
    "llama4_text",
    "deepseek",
    "qwen2_moe",
    "gpt_oss",
    "glm4_moe",
    "minimax",
)
TERMS = ("gpt_oss", "gemma2")  # honoured architectures whose layers add terms to their softmax
# Kimi K2.5 (mlx-lm's kimi_k25): deepseek_v3's language model inside a vision-language wrapper, its
# config a text_config of its own (the vision tower is dropped at load); as Kimi's, a LoRA on the
# queries (q_a_proj, q_a_layernorm, q_b_proj) and YaRN RoPE (its mscale in the softmax scale)
_YARN = dict(
    type="yarn",
    factor=4.0,
    original_max_position_embeddings=128,
    beta_fast=32,
    beta_slow=1,
    mscale=1.0,
    mscale_all_dim=1.0,
)
HONOURED["kimi_k25"] = dict(
    text_config={
        **BASE,
        "model_type": "deepseek_v3",
        **HONOURED["deepseek_v3"],
        "q_lora_rank": 32,
        "rope_scaling": _YARN,
    }
)
LATENT = ("deepseek_v3", "kimi_k25")  # honoured ones with multi-head latent attention (values narrower than keys)

# architecture -> (config, the layer kind its refusal names)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "hunyuan_v1_dense": ({}, "attention of an unknown layout"),  # q/k norms after RoPE, other names
    "stablelm": (
        dict(partial_rotary_factor=0.25, use_qkv_bias=False, layer_norm_eps=1e-5),
        "attention of an unknown layout",
    ),  # no softmax scale the adapter can read
}

# hybrids: some layers keep a recurrent state instead of keys (mlx-lm's own cache for those layers;
# every method runs on the attention layers: test_mlx_hybrids.py)
HYBRID: dict[str, dict[str, Any]] = {
    "qwen3_next": dict(
        _MOE,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        shared_expert_intermediate_size=32,
        partial_rotary_factor=0.25,
    ),
    "lfm2": dict(
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_ff_dim=128,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        full_attn_idxs=[1],
        norm_eps=1e-5,
    ),
    # gated delta-net (linear attention) on layer 0, gated softmax attention on layer 1
    "qwen3_5": dict(
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
    ),
    "qwen3_5_moe": dict(
        _MOE,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        shared_expert_intermediate_size=32,
    ),
}

HYBRID["nemotron_h"] = dict(  # Mamba-2, attention (NoPE), MLP and MoE blocks, one mixer each
    hybrid_override_pattern=["M", "*", "-", "E"],
    num_hidden_layers=4,
    attention_bias=False,
    mamba_num_heads=4,
    mamba_head_dim=16,
    mamba_proj_bias=False,
    ssm_state_size=16,
    conv_kernel=4,
    n_groups=2,
    mlp_bias=False,
    layer_norm_epsilon=1e-5,
    use_bias=False,
    use_conv_bias=True,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=32,
    n_group=1,
    n_routed_experts=4,
    n_shared_experts=1,
    topk_group=1,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
)

HYBRID["granitemoehybrid"] = dict(  # Mamba-2 and attention layers, Granite's multipliers, MoE
    _GRANITE,
    layer_types=["mamba", "attention"],
    num_local_experts=4,
    num_experts_per_tok=2,
    shared_intermediate_size=32,
    mamba_n_heads=4,
    mamba_d_head=32,
    mamba_proj_bias=False,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_n_groups=1,
    mamba_conv_bias=True,
)
HYBRID["jamba"] = dict(  # Mamba and attention (NoPE) layers, MoE on every other layer
    attn_layer_offset=1,
    attn_layer_period=2,
    expert_layer_offset=1,
    expert_layer_period=2,
    mamba_d_conv=4,
    mamba_d_state=16,
    mamba_expand=2,
    num_experts=4,
    num_experts_per_tok=2,
)

HYBRID["falcon_h1"] = dict(  # every layer: attention and a Mamba-2 mixer side by side (parallel)
    mamba_d_ssm=128,
    mamba_d_head=32,
    mamba_n_heads=4,
    mamba_d_state=16,
    mamba_chunk_size=8,
    mlp_expansion_factor=2,
)

HYBRID["kimi_linear"] = dict(  # Kimi delta attention (linear) on layer 0, latent attention on layer 1
    _MOE,
    linear_attn_config=dict(kda_layers=[1], num_heads=4, head_dim=16, short_conv_kernel_size=4),
    model_max_length=512,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    num_experts_per_token=2,
    num_shared_experts=1,
    first_k_dense_replace=1,
)

REMAPPED = {"mistral": "llama"}  # model types mlx-lm runs with another type's model file


def build(arch: str, config: dict[str, Any] | None = None, seed: int = 0) -> nn.Module:
    """mlx-lm's own Model for `arch` from BASE plus the arch's config, random weights (fp32)."""
    module = importlib.import_module(f"mlx_lm.models.{REMAPPED.get(arch, arch)}")
    known = {**HONOURED, **{name: refused[0] for name, refused in REFUSED.items()}, **HYBRID}
    extra = config if config is not None else known[arch]
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict({**BASE, "model_type": arch, **extra}))
    # norms start at 1 (or 0 where the weight is an offset or a plain multiplier, Cohere's q/k
    # norms): perturbed, so that a norm applied in the wrong place or not at all shows
    norms = [
        (name, value + 0.3 * mx.random.normal(value.shape, key=mx.random.key(seed + i)))
        for i, (name, value) in enumerate(tree_flatten(model.parameters()))
        if "norm" in name
    ]
    sinks = [
        (name, mx.random.normal(value.shape, key=mx.random.key(seed + 1000 + i)))  # gpt_oss's start at 0
        for i, (name, value) in enumerate(tree_flatten(model.parameters()))
        if name.endswith(".sinks")
    ]
    model.load_weights(norms + sinks, strict=False)
    mx.eval(model.parameters())
    return model


def save_directory(arch: str, directory: Path, config: dict[str, Any] | None = None, bits: int | None = None) -> Path:
    """An mlx-lm directory of build(arch, config): config.json, model.safetensors (mlx-lm's own
    parameter names, quantized to `bits` in groups of 32 as mlx-lm's convert does) and the tiny
    tokenizer."""
    extra = config if config is not None else {**HONOURED, **HYBRID}.get(arch, {})
    model = build(arch, extra)
    written = {**BASE, "model_type": arch, **extra}
    if bits is not None:
        nn.quantize(model, group_size=32, bits=bits)
        written["quantization"] = {"group_size": 32, "bits": bits}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(written))
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (directory / "tokenizer.json").write_text(tiny_bpe_tokenizer_json())
    (directory / "tokenizer_config.json").write_text(json.dumps(tiny_tokenizer_config()))
    return directory
