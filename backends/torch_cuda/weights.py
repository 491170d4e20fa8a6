"""Hugging Face-named NumPy weights -> a Transformer on the target device and dtype.

The shared loader (specfill.core.io.weights) gives every checkpoint format the same names and the
rotate-half Q/K layout, and its `check_tensors` is the one list of what a model holds; this
file only fuses q/k/v. GGUF files take the lean path instead (lean_load.py: tensor by tensor into
the target dtype and device), which ends in the same `transformer_from_state`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from specfill.core.models import ModelArgs
from specfill.core.io.weights import check_tensors

from .model import Transformer
from .rope import RotaryEmbedding


def _state_dict(args: ModelArgs, weights: Mapping[str, np.ndarray], dtype: torch.dtype,
                device: torch.device) -> dict[str, torch.Tensor]:
    def get(name: str) -> torch.Tensor:
        array = weights[name]
        array = array if array.flags.writeable else array.copy()
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

    def qkv(prefix: str, kind: str) -> torch.Tensor:
        return torch.cat([get(prefix + f"{w}_proj.{kind}") for w in "qkv"])

    state = {"embed.weight": get("model.embed_tokens.weight"),
             "norm.weight": get("model.norm.weight")}
    state["lm_head.weight"] = (state["embed.weight"] if args.tie_word_embeddings
                               else get("lm_head.weight"))
    for i in range(args.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        state[dst + "attention.wqkv.weight"] = qkv(attn, "weight")
        if "q_proj" in args.biased_projections:
            state[dst + "attention.wqkv.bias"] = qkv(attn, "bias")
        state[dst + "attention.wo.weight"] = get(attn + "o_proj.weight")
        if "o_proj" in args.biased_projections:
            state[dst + "attention.wo.bias"] = get(attn + "o_proj.bias")
        if args.qk_norm:
            state[dst + "attention.q_norm.weight"] = get(attn + "q_norm.weight")
            state[dst + "attention.k_norm.weight"] = get(attn + "k_norm.weight")
        state[dst + "mlp.w_gate.weight"] = get(src + "mlp.gate_proj.weight")
        state[dst + "mlp.w_up.weight"] = get(src + "mlp.up_proj.weight")
        state[dst + "mlp.w_down.weight"] = get(src + "mlp.down_proj.weight")
        for ours, theirs in block_norm_names(args).items():
            state[dst + f"{ours}.weight"] = get(src + f"{theirs}.weight")
    return state


def block_norm_names(args: ModelArgs) -> dict[str, str]:
    """A block's norms: our module name -> the HF name. HF's post_attention_layernorm is the
    pre-MLP norm in Llama-style blocks but normalises the attention output in Gemma 3's."""
    if args.sandwich_norms:
        return {"attention_norm": "input_layernorm", "attention_out_norm": "post_attention_layernorm",
                "mlp_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
    return {"attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def build_transformer(args: ModelArgs, weights: Mapping[str, np.ndarray], dtype: torch.dtype,
                      device: torch.device | str) -> Transformer:
    """The model with `weights` (HF names, rotate-half Q/K) in `dtype` on `device`, eval mode,
    no gradients. Missing, unexpected or misshapen tensors raise ModelLoadError."""
    device = torch.device(device)
    check_tensors(args, {name: w.shape for name, w in weights.items()}, "the weights")
    return transformer_from_state(args, _state_dict(args, weights, dtype, device), device)


def transformer_from_state(args: ModelArgs, state: Mapping[str, torch.Tensor],
                           device: torch.device | str) -> Transformer:
    """The model holding `state` (the Transformer's names, e.g. from lean_load) without a copy,
    eval mode, no gradients."""
    device = torch.device(device)
    with torch.device("meta"):
        model = Transformer(args)
    model.load_state_dict(state, strict=True, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope = RotaryEmbedding(args).to(device)  # its buffer was built on the meta device
    if model.rope_local is not None:
        model.rope_local = RotaryEmbedding(args, local=True).to(device)
    return model.eval().requires_grad_(False)
