"""Attention strategies: how one layer turns a step's post-RoPE q/k/v into attention output.

`Attention` projects, normalises and rotates q/k/v, writes k/v to the layer's cache, then hands
everything to a `PrefillAttention`. Full causal attention is the default; H2O's two-phase prefill
plugs in its own strategy with the same signature (decode always uses full attention).
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from .kv_cache import LayerKVCache


class PrefillAttention(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cache: LayerKVCache, start: int) -> torch.Tensor:
        """q [1, Hq, T, D], k/v [1, Hkv, T, D]: the step's tokens after RoPE (and q/k norm),
        already stored in `cache` slots [start, start + T). Returns the attention output
        [1, Hq, T, D] in q's dtype; query head h reads KV head h // (Hq // Hkv)."""


def causal_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cache: LayerKVCache, start: int) -> torch.Tensor:
    """Each query attends to every slot up to its own (slots 0..start + t)."""
    steps = q.shape[2]
    end = start + steps
    gqa = q.shape[1] != k.shape[1]
    if start == 0:  # the step's own keys are the whole context: plain causal
        return F.scaled_dot_product_attention(q, k, v, is_causal=steps > 1, enable_gqa=gqa)
    keys, values = cache.keys(end), cache.values(end)
    if steps == 1:  # one query sees every filled slot
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=gqa)
    if q.device.type == "cpu" and _cpu_flash() is not None:
        return _cpu_prefix_then_causal(q, keys, values, start)
    return lower_right_causal(q, keys, values)


def lower_right_causal(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last T of S slots (query t sees slots 0..S - T + t). On CUDA the
    lower-right causal bias runs the flash / memory-efficient kernels without a materialised
    mask; those raw kernels take equal head counts, so KV heads are expanded first."""
    # imported here: torch.nn.attention.bias imports Triton, which CPU-only runs never need
    from torch.nn.attention.bias import causal_lower_right

    group = q.shape[1] // keys.shape[1]
    if group > 1:
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, keys, values,
                                          attn_mask=causal_lower_right(q.shape[2], keys.shape[2]))


def _cpu_flash():
    """torch's CPU flash kernel returning (out, log-sum-exp); a private op, so None where a torch
    build lacks it (the caller then takes the generic masked path)."""
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


def _cpu_prefix_then_causal(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            start: int) -> torch.Tensor:
    """A query chunk after `start` cached slots, as two fused CPU flash calls merged by their
    log-sum-exp: unmasked over the prefix, causal over the chunk. A boolean mask would make the
    kernel do the full rectangle, ~1.4x the work at 2K over 4K keys."""
    flash = _cpu_flash()
    out_prefix, lse_prefix = flash(q, keys[:, :, :start], values[:, :, :start], 0.0, False)
    out_chunk, lse_chunk = flash(q, keys[:, :, start:], values[:, :, start:], 0.0, True)
    lse = torch.logaddexp(lse_prefix, lse_chunk)  # float32 softmax statistics [1, Hq, T]
    w_prefix = torch.exp(lse_prefix - lse).unsqueeze(-1)
    w_chunk = torch.exp(lse_chunk - lse).unsqueeze(-1)
    return (out_prefix.float() * w_prefix + out_chunk.float() * w_chunk).to(q.dtype)
