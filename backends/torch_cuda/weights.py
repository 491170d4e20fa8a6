"""Hugging Face-named NumPy weights -> a Transformer on the target device and dtype.

The shared loader (specfill.core.io.weights) gives every checkpoint format the same names and the
rotate-half Q/K layout, and its `check_tensors` is the one list of what a model holds; the
Transformer's modules carry the same names, so this file only drops the "model." prefix and fuses
q/k/v into `qkv_proj`. GGUF files take the lean path instead (lean_load.py: tensor by tensor into
the target dtype and device), which ends in the same `transformer_from_state`.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from specfill.core.io.weights import check_tensors
from specfill.core.models import ModelArgs, expected_tensor_shapes

from .model import Transformer
from .rope import RotaryEmbedding


def _state_dict(
    args: ModelArgs, weights: Mapping[str, np.ndarray], dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    def get(name: str) -> torch.Tensor:
        array = weights[name]
        array = array if array.flags.writeable else array.copy()
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

    return _fused_state(args, list(weights), get)


def _fused_state(args: ModelArgs, names: list[str], get: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Transformer's state from HF names, each tensor made by get(name); q/k/v fused."""

    def qkv(prefix: str, kind: str) -> torch.Tensor:
        return torch.cat([get(prefix + f"{w}_proj.{kind}") for w in "qkv"])

    state: dict[str, torch.Tensor] = {}
    for name in names:
        ours = module_name(name)
        if ours is not None:
            state[ours] = get(name)
    if args.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    for i in range(args.num_hidden_layers):
        for kind in ("weight", "bias"):
            if f"model.layers.{i}.self_attn.q_proj.{kind}" in names:
                state[f"layers.{i}.self_attn.qkv_proj.{kind}"] = qkv(f"model.layers.{i}.self_attn.", kind)
    return state


def random_transformer(args: ModelArgs, dtype: torch.dtype, device: torch.device | str, seed: int = 0) -> Transformer:
    """random:SHAPE drawn on `device` itself (torch's generator there: N(0, 0.02) matrices, norm
    weights 1, biases 0, as core.io.random_model draws them in NumPy but not the same numbers).
    An 8B shape is drawn in about a second on a GPU, where the NumPy route would first fill 32 GB
    of float32 host memory; only the largest tensor exists twice, briefly (q/k/v before fusing)."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    shapes = expected_tensor_shapes(args)

    def get(name: str) -> torch.Tensor:
        shape = shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(shape, dtype=dtype, device=device)
        if name.endswith(".bias"):
            return torch.zeros(shape, dtype=dtype, device=device)
        return torch.randn(shape, generator=generator, dtype=dtype, device=device).mul_(0.02)

    return transformer_from_state(args, _fused_state(args, list(shapes), get), device)


def module_name(hf_name: str) -> str | None:
    """The Transformer's name for an HF tensor name: the same without the "model." prefix (the
    modules carry HF's names), None for q/k/v, which load fused into `self_attn.qkv_proj`."""
    if hf_name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"):
        return None
    return hf_name.removeprefix("model.")


def build_transformer(
    args: ModelArgs, weights: Mapping[str, np.ndarray], dtype: torch.dtype, device: torch.device | str
) -> Transformer:
    """The model with `weights` (HF names, rotate-half Q/K) in `dtype` on `device`, eval mode,
    no gradients. Missing, unexpected or misshapen tensors raise ModelLoadError."""
    device = torch.device(device)
    check_tensors(args, {name: w.shape for name, w in weights.items()}, "the weights")
    return transformer_from_state(args, _state_dict(args, weights, dtype, device), device)


def transformer_from_state(
    args: ModelArgs, state: Mapping[str, torch.Tensor], device: torch.device | str
) -> Transformer:
    """The model holding `state` (the Transformer's names, e.g. from lean_load) without a copy,
    eval mode, no gradients."""
    device = torch.device(device)
    with torch.device("meta"):
        model = Transformer(args)
    model.load_state_dict(state, strict=True, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rope = RotaryEmbedding(args).to(device)  # its buffer was built on the meta device
    if model.rope_local is not None:
        model.rope_local = RotaryEmbedding(args, local=True).to(device)
    return model.eval().requires_grad_(False)
