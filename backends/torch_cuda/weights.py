"""Hugging Face-named NumPy weights -> a Transformer on the target device and dtype.

The shared loader (specfill.core.weights) gives every checkpoint format the same names and the
rotate-half Q/K layout; this file only fuses q/k/v and checks names and shapes.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from specfill.core.errors import ModelLoadError
from specfill.core.models import ModelArgs

from .model import Transformer, output_bias
from .rope import RotaryEmbedding

# Present in some checkpoints, recomputed or unused here.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    hidden, ffn, vocab, d = (args.hidden_size, args.intermediate_size, args.vocab_size,
                             args.head_dim)
    q, kv = args.num_attention_heads * d, args.num_key_value_heads * d
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                   p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, q)}
        if args.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if output_bias(args):
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if args.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        shapes |= {p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                   p + "mlp.down_proj.weight": (hidden, ffn),
                   p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)}
    return shapes


def _check_tensors(args: ModelArgs, weights: Mapping[str, np.ndarray]) -> None:
    """Every tensor the config implies is there with its shape, and nothing unknown is."""
    expected = _expected_shapes(args)
    missing = [n for n in expected if n not in weights]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"checkpoint lacks tensor {missing[0]!r}{more}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(weights[name].shape)}, "
                                 f"the model config implies {shape}")
    known = set(expected) | {"lm_head.weight"}  # a tied checkpoint may still carry lm_head
    unexpected = sorted(n for n in weights if n not in known and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        raise ModelLoadError(f"checkpoint has tensor {unexpected[0]!r} that the {args.architecture} "
                             f"model does not use (unsupported variant?)")


def _state_dict(args: ModelArgs, weights: Mapping[str, np.ndarray], dtype: torch.dtype,
                device: torch.device) -> dict[str, torch.Tensor]:
    def get(name: str) -> torch.Tensor:
        array = weights[name]
        array = array if array.flags.writeable else array.copy()
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

    state = {"embed.weight": get("model.embed_tokens.weight"), "norm.weight": get("model.norm.weight")}
    state["lm_head.weight"] = (state["embed.weight"] if args.tie_word_embeddings
                               else get("lm_head.weight"))
    for i in range(args.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        state[dst + "attention.wqkv.weight"] = torch.cat([get(attn + f"{w}_proj.weight") for w in "qkv"])
        if args.attention_bias:
            state[dst + "attention.wqkv.bias"] = torch.cat([get(attn + f"{w}_proj.bias") for w in "qkv"])
        state[dst + "attention.wo.weight"] = get(attn + "o_proj.weight")
        if output_bias(args):
            state[dst + "attention.wo.bias"] = get(attn + "o_proj.bias")
        if args.qk_norm:
            state[dst + "attention.q_norm.weight"] = get(attn + "q_norm.weight")
            state[dst + "attention.k_norm.weight"] = get(attn + "k_norm.weight")
        state[dst + "mlp.w_gate.weight"] = get(src + "mlp.gate_proj.weight")
        state[dst + "mlp.w_up.weight"] = get(src + "mlp.up_proj.weight")
        state[dst + "mlp.w_down.weight"] = get(src + "mlp.down_proj.weight")
        state[dst + "attention_norm.weight"] = get(src + "input_layernorm.weight")
        state[dst + "mlp_norm.weight"] = get(src + "post_attention_layernorm.weight")
    return state


def build_transformer(args: ModelArgs, weights: Mapping[str, np.ndarray], dtype: torch.dtype,
                      device: torch.device | str) -> Transformer:
    """The model with `weights` (HF names, rotate-half Q/K) in `dtype` on `device`, eval mode,
    no gradients. Missing, unexpected or misshapen tensors raise ModelLoadError."""
    device = torch.device(device)
    _check_tensors(args, weights)
    with torch.device("meta"):
        model = Transformer(args)
    state = _state_dict(args, weights, dtype, device)
    model.load_state_dict(state, strict=True, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope = RotaryEmbedding(args).to(device)  # its buffer was built on the meta device
    return model.eval().requires_grad_(False)
