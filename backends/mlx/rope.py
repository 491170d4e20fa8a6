"""Rotary position embedding at explicit per-token positions, on mx.fast.rope.

Speculative prefill feeds the kept tokens at their original, non-contiguous positions (e.g.
[0, 1, 3, 6, 7]) and then decodes at the prompt's length, so positions are given per token.
mx.fast.rope takes one offset per batch row, not per token; with batch 1 we make every token its
own batch row of length 1, so the array offset becomes a per-token position. Contiguous
positions take the ordinary path; both run the same kernel and give bit-identical results.
Q/K use Hugging Face's rotate-half layout (llama.cpp's row permutation is undone at load).
"""

from __future__ import annotations

from typing import TypeAlias

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specfill.core.models import ModelArgs
from specfill.core.rope import rope_inv_freq

# A step's positions: an int is the first of consecutive positions, an array [T] gives each
# token's own position.
Positions: TypeAlias = "int | mx.array"


class RoPE(nn.Module):
    """Rotates q or k [1, T, H, D] (token-major, as projected) to [1, H, T, D]."""

    def __init__(self, args: ModelArgs, local: bool = False):
        """local: the sliding layers' table where the family gives them their own base (Gemma 3)."""
        super().__init__()
        self.dims = args.head_dim
        # fast.rope wants periods (1 / inverse frequency); the checkpoint's scaling is in them.
        periods = 1.0 / rope_inv_freq(args, local).astype(np.float64)
        self._periods = mx.array(periods.astype(np.float32))

    def _rope(self, x: mx.array, offset: int | mx.array) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=self._periods)

    def __call__(self, x: mx.array, positions: Positions) -> mx.array:
        _, steps, heads, dim = x.shape
        if isinstance(positions, (int, np.integer)):
            return self._rope(x.swapaxes(1, 2), int(positions))
        if positions.shape != (steps,):
            raise ValueError(f"positions {positions.shape} do not match {steps} tokens")
        per_token = self._rope(x.reshape(steps, heads, 1, dim), positions.astype(mx.int32))
        return per_token.reshape(1, steps, heads, dim).swapaxes(1, 2)
