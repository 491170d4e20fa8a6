"""Tiny configs of mlx-lm architectures (2 layers, hidden 64, 4 query heads over 2 KV heads, head dim
16, vocabulary 97) and the mlx-lm models built from them with seeded random weights.

HONOURED: the adapter runs every method on them (the project's own five families are not here:
they have model files of their own; test_own_families.py compares the two). MOE marks mixtures of
experts. REFUSED: architectures whose layers a sparse method cannot run, with the layer kind
named in the refusal (full prefill and decoding still work on them).
"""
from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn

BASE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, vocab_size=97, max_position_embeddings=512,
            rope_theta=10000.0, tie_word_embeddings=False)
_MOE = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[])
_GRANITE = dict(embedding_multiplier=2.0, attention_multiplier=0.2, logits_scaling=4.0, residual_multiplier=0.5,
                attention_bias=False)

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
}
MOE = ("qwen3_moe", "mixtral", "granitemoe", "olmoe", "phimoe")

# architecture -> (config, the layer kind its refusal names)
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "gpt_oss": (dict(_MOE, experts_per_token=2), "attention sinks"),
    "gemma2": (dict(query_pre_attn_scalar=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
               "attention logit soft-capping"),
    "deepseek_v3": (dict(_MOE, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
                         v_head_dim=16, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1,
                         moe_layer_freq=1, routed_scaling_factor=1.0, topk_method="noaux_tc", n_group=1,
                         topk_group=1), "multi-head latent attention"),
    "hunyuan_v1_dense": ({}, "attention of an unknown layout"),
}


def build(arch: str, config: dict[str, Any] | None = None, seed: int = 0) -> nn.Module:
    """mlx-lm's own Model for `arch` from BASE plus the arch's config, random weights (fp32)."""
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    extra = config if config is not None else (HONOURED[arch] if arch in HONOURED else REFUSED[arch][0])
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(dict(BASE, model_type=arch, **extra)))
    mx.eval(model.parameters())
    return model
