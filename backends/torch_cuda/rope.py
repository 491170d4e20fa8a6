"""Rotary position embedding from explicit per-token position ids.

Positions are a tensor, never an offset: speculative prefill feeds kept tokens at their original,
non-contiguous positions (e.g. [0, 1, 3, 6, 7]) and then decodes at the next prompt position.
Q/K use Hugging Face's rotate-half layout (the shared loader un-permutes llama.cpp's rows).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from specfill.core.errors import ModelLoadError
from specfill.core.models import ModelArgs

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_type(scaling: Mapping[str, Any] | None) -> str:
    """The checkpoint's rope type; older configs spell the key "type"."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def _scaling_value(scaling: Mapping[str, Any], key: str) -> float:
    if key not in scaling:
        raise ModelLoadError(f"rope scaling {rope_type(scaling)!r} lacks {key!r}")
    return float(scaling[key])


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency remap: long wavelengths divided by `factor`, short ones kept, a smooth
    ramp in between."""
    factor = _scaling_value(scaling, "factor")
    low = _scaling_value(scaling, "low_freq_factor")
    high = _scaling_value(scaling, "high_freq_factor")
    old_context = _scaling_value(scaling, "original_max_position_embeddings")
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies after the checkpoint's scaling."""
    dim = args.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (args.rope_theta ** exponents)
    kind = rope_type(args.rope_scaling)
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / _scaling_value(args.rope_scaling, "factor")
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, args.rope_scaling)
    raise ModelLoadError(f"unsupported rope scaling {kind!r} "
                         f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")


class RotaryEmbedding(nn.Module):
    """Maps position ids [T] to (cos, sin) tables [T, head_dim] in the activation dtype."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float32 whatever the model dtype: bf16 positions above 256 would round.
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by the tables [T, D] of its tokens' positions."""
    return x * cos + rotate_half(x) * sin
