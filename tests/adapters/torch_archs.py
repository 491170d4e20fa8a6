"""Tiny configs of transformers model types (2 layers, hidden 64, 4 query heads over 2 KV heads,
head dim 16, vocabulary 320, the tiny tokenizer's) and transformers models built from them with
seeded random weights (fp32).

HONOURED: the adapter runs every method on them (the project's own five families are not here:
they have model files of their own); TERMS: those of them whose layers add attention sinks or a
logit soft-cap to their softmax. MOE marks mixtures of experts. REFUSED: model types whose
layers a sparse method cannot run, with the layer kind the refusal names (full prefill and
decoding still work on them). AT_LOAD: model types refused at load, with the kind named. HYBRID:
recurrent layers beside attention layers (test_torch_hybrids.py builds them with four layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.fixtures.tiny_tokenizer import tiny_bpe_tokenizer_json, tiny_tokenizer_config, tiny_vocab

BASE = dict(
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    vocab_size=320,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
_MOE = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_SLIDING = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])

HONOURED: dict[str, dict[str, Any]] = {
    "qwen3_moe": _MOE,
    "mixtral": dict(_MOE, sliding_window=8),  # every layer slides
    "granitemoe": dict(
        _MOE, embedding_multiplier=2.0, attention_multiplier=0.2, logits_scaling=4.0, residual_multiplier=0.5
    ),
    "olmoe": _MOE,
    "phimoe": _MOE,
    "qwen2_moe": dict(_MOE, shared_expert_intermediate_size=32),
    "phi3": {},  # fused qkv projection
    "olmo2": {},  # q/k RMSNorm over all heads at once
    "glm4": dict(partial_rotary_factor=0.5, attention_bias=True),  # RoPE on half of each head
    "starcoder2": dict(sliding_window=8),  # biases, LayerNorm
    "smollm3": dict(no_rope_layer_interval=2),  # NoPE layers
    "exaone4": _SLIDING,
    "cohere": dict(use_qk_norm=True, logit_scale=2.0),  # LayerNorm per head
    "gemma": {},
    "stablelm": dict(partial_rotary_factor=0.25),
    "gpt_neox": dict(rotary_pct=0.5),  # parallel residual, fused qkv
    "glm4_moe": dict(_MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1),
    "ernie4_5_moe": dict(_MOE, moe_num_experts=4, moe_k=2, moe_layer_start_index=1),
    "hunyuan_v1_moe": dict(_MOE, use_qk_norm=True),
    "jetmoe": dict(_MOE, kv_channels=16, num_local_experts=4),  # mixture of attention heads' experts too
    "granite": dict(embedding_multiplier=2.0, attention_multiplier=0.2, logits_scaling=4.0, residual_multiplier=0.5),
    "nemotron": dict(partial_rotary_factor=0.5),  # LayerNorm1P, relu2
    "olmo3": _SLIDING,
    "gpt2": {},  # learned absolute positions, no RoPE
    "hunyuan_v1_dense": dict(use_qk_norm=True),  # q/k norms after RoPE
    "apertus": {},  # xIELU MLP, q/k norms
    # attention terms (core/stages.AttentionTerms): sinks (build() draws them N(0, 1), so that they
    # hold a real share of every softmax), a logit soft-cap low enough to bind at these logits (and
    # the LM head's own final soft-capping, the family's code)
    "gpt_oss": dict(_MOE, **_SLIDING),
    "gemma2": dict(query_pre_attn_scalar=16, attn_logit_softcapping=2.0, final_logit_softcapping=30.0, **_SLIDING),
    # multi-head latent attention: keys of qk_nope + qk_rope = 24 dims, values of v_head_dim = 16
    "deepseek_v3": dict(
        _MOE,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),
}
TERMS = ("gpt_oss", "gemma2")  # honoured model types whose layers add terms to their softmax
LATENT = ("deepseek_v3",)  # honoured ones with multi-head latent attention (values narrower than keys)
MOE = (
    "deepseek_v3",
    "qwen3_moe",
    "mixtral",
    "granitemoe",
    "olmoe",
    "phimoe",
    "qwen2_moe",
    "glm4_moe",
    "ernie4_5_moe",
    "hunyuan_v1_moe",
    "jetmoe",
    "gpt_oss",
)

# model type -> (config, the layer kind its refusal names)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    # a dynamic RoPE: its frequencies follow each step's longest position (OLMo 1's plain attention)
    "olmo": (dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0)), "dynamic RoPE"),
}

# model type -> (config, the layer kind the load error names)
AT_LOAD: dict[str, tuple[dict[str, Any], str]] = {
    "llama4_text": (dict(_MOE, attention_chunk_size=8, intermediate_size_mlp=128), "chunked attention"),
    "bloom": ({}, "does not run its attention through transformers' AttentionInterface"),  # ALiBi, own attention
    # Gemma 4: full-attention layers' heads twice as wide as the sliding layers' (global_head_dim),
    # as in every Gemma 4 checkpoint; v RMS-normed, partial proportional RoPE, per-layer inputs
    "gemma4_text": (
        dict(
            _SLIDING,
            global_head_dim=32,
            final_logit_softcapping=30.0,
            hidden_size_per_layer_input=16,
            vocab_size_per_layer_input=320,
        ),
        "attention of another KV shape",
    ),
}


_DELTA = dict(
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    full_attention_interval=2,
)
# model type -> config of a hybrid (recurrent layers beside attention: hybrid_cache.py holds both);
# test_torch_hybrids.py builds them with four layers. The causal LM of transformers' qwen3_5 /
# qwen3_5_moe checkpoints is the _text model type.
HYBRID: dict[str, dict[str, Any]] = {
    "qwen3_next": dict(_MOE, **_DELTA, shared_expert_intermediate_size=32),
    "qwen3_5_text": dict(_DELTA),  # gated delta-net on layer 0, gated softmax attention on layer 1
    "qwen3_5_moe_text": dict(_MOE, **_DELTA, shared_expert_intermediate_size=32),
    "lfm2": dict(
        conv_L_cache=3, block_multiple_of=16, block_auto_adjust_ff_dim=False, full_attn_idxs=[1], norm_eps=1e-5
    ),
    "nemotron_h": dict(  # Mamba-2, attention, MLP and MoE blocks, one mixer each
        layers_block_type=["mamba", "attention", "mlp", "moe"],
        num_hidden_layers=4,
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        conv_kernel=4,
        n_groups=2,
        chunk_size=8,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
    ),
    "granitemoehybrid": dict(  # Mamba-2 and attention layers, Granite's multipliers, MoE
        layer_types=["mamba", "attention"],
        embedding_multiplier=2.0,
        attention_multiplier=0.2,
        logits_scaling=4.0,
        residual_multiplier=0.5,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=32,
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_n_groups=1,
        mamba_chunk_size=8,
    ),
    "falcon_h1": dict(  # every layer: attention and a Mamba-2 mixer side by side
        mamba_d_ssm=128, mamba_d_head=32, mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8
    ),
    "kimi_linear": dict(  # Kimi delta attention (linear) on layer 0, latent attention on layer 1
        _MOE,
        layer_types=["linear_attention", "full_attention"],
        linear_num_heads=4,
        linear_head_dim=16,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_shared_experts=1,
        num_key_value_heads=4,  # latent attention: one key / value head per query head
    ),
}


# MiniMax-Text-01 (transformers' minimax): lightning (linear) attention on layer 0, softmax on layer 1;
# its state lives in MiniMaxCache.linear_cache (hybrid_cache.py's "lightning" kind)
HYBRID["minimax"] = dict(_MOE, layer_types=["linear_attention", "full_attention"], block_size=8)
# Jamba: Mamba and attention (NoPE) layers, MoE on every other layer; its mixer starts a step of several
# tokens from a zero SSM state, so specfill runs a continued step's Mamba layers token by token
HYBRID["jamba"] = dict(
    attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2, num_experts=4
)


def config_of(arch: str, extra: dict[str, Any] | None = None) -> Any:
    from transformers import AutoConfig

    known = {**HONOURED, **HYBRID, **{name: c for name, (c, _) in {**REFUSED, **AT_LOAD}.items()}}
    return AutoConfig.for_model(arch, **{**BASE, **(known[arch] if extra is None else extra)})


def build(arch: str, extra: dict[str, Any] | None = None, seed: int = 0) -> torch.nn.Module:
    """transformers' own ForCausalLM for `arch` from BASE plus the arch's config, with seeded random
    weights large enough that attention is far from uniform (std 0.15; norm weights 1 + 0.3 noise, so
    that a norm or a position applied wrongly shows)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config_of(arch, extra), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
            elif name.endswith(".sinks"):  # per-head attention sinks (gpt_oss)
                parameter.normal_(0.0, 1.0)
            elif parameter.dim() >= 2:
                parameter.normal_(0.0, 0.15)
    return model


def save_directory(arch: str, directory: Path, extra: dict[str, Any] | None = None) -> Path:
    """A transformers directory of build(arch): config.json, model.safetensors (save_pretrained)
    and the tiny tokenizer."""
    build(arch, extra).save_pretrained(directory)
    (directory / "tokenizer.json").write_text(tiny_bpe_tokenizer_json())
    (directory / "tokenizer_config.json").write_text(json.dumps(tiny_tokenizer_config()))
    return directory


def save_gguf(arch: str, path: Path, quant: str = "F32") -> Path:
    """A GGUF file of build(arch, {}) (no sliding window: GGUF metadata has none for these types),
    written with gguf-py: llama.cpp's tensor names (gguf's own name map), the metadata
    transformers' GGUF reader takes for `arch`, the tiny tokenizer; 2-D weights stored as `quant`
    ("F32" or "Q8_0"), the rest F32."""
    import gguf

    model = build(arch, {})
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_eps(config.norm_epsilon)
    writer.add_vocab_size(config.vocab_size)
    tokens, types, merges = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BASE["bos_token_id"])
    writer.add_eos_token_id(BASE["eos_token_id"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    qtype = gguf.GGMLQuantizationType[quant]
    for name, tensor in model.state_dict().items():
        array = tensor.numpy().astype(np.float32)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
