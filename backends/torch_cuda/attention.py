"""Attention strategies: how one layer turns a step's post-RoPE q/k/v into attention output.

`Attention` projects, normalises and rotates q/k/v, stores k/v with the layer cache's
`update_and_fetch`, then attends over every cached slot: causal attention by default, or a
`PrefillAttention` (core/ops.py: H2O's two-phase walk, the speculator's query capture) with the
same arguments. Decode always uses full attention, over the layer's sliding window where it has
one (`windowed_attention`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .placement import on_cuda


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """q [1, Hq, T, D] of a step against every cached slot keys/values [1, Hkv, S, D] (the
    step's own in the last T): query t sees slots 0..S - T + t. Returns [1, Hq, T, D]."""
    if values.shape[-1] < keys.shape[-1]:  # latent attention: torch's fused flash kernels take one head size;
        # zero columns change no weight and give zero outputs, cut off (the torch adapter pads its cache once)
        padded = F.pad(values, (0, keys.shape[-1] - values.shape[-1]))
        return causal_attention(q, keys, padded, scale)[..., : values.shape[-1]]
    steps, end = q.shape[2], keys.shape[2]
    start = end - steps
    gqa = q.shape[1] != keys.shape[1]
    if start == 0 and steps > 1 and q.device.type == "cuda":  # the fastest fused kernel here (probed once)
        from .attention_choice import kernel_for

        return kernel_for("causal", q, keys, values)(q, keys, values, 0, scale)
    if start == 0:  # the step's own keys are the whole context: plain causal
        return F.scaled_dot_product_attention(q, keys, values, is_causal=steps > 1, enable_gqa=gqa, scale=scale)
    if not on_cuda(q) and steps <= CPU_FEW_QUERIES:  # decode, speculative verify
        return few_queries_cpu(q, keys, values, start, scale)
    if steps == 1 and q.device.type == "cuda":  # decode on a GPU: the replayed step's attention call
        return one_query_cuda(q, keys, values, scale)
    if steps == 1:  # one query sees every filled slot
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=gqa, scale=scale)
    if not on_cuda(q) and _cpu_flash() is not None:
        return _cpu_prefix_then_causal(q, keys, values, start, scale)
    return lower_right_causal(q, keys, values, scale)


CPU_FEW_QUERIES = 8  # decode (1 query) and a speculative verify (k + 1 queries) take this path on CPU


def one_query_cuda(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """One decode query q [1, Hq, 1, D] over every slot of keys / values [1, Hkv, S, D] on a GPU, through
    the call a static decode step makes (attention_choice.grouped_decode: grouped heads folded into rows,
    decode_kernel's probed choice, the split-key Triton kernel or masked SDPA) with a
    zero bias: a replayed step reads a bucket of slots whose unfilled tail its bias hides, and those
    slots add exact zeros to the same splits' sums (the same split plan up to 32K slots), so the eager
    and the replayed decode compute the same logits and pick the same tokens in bfloat16 too (where
    torch's one-query SDPA rounded differently and greedy tokens parted after a few steps on random
    weights: results/gpu/h200/2026-11-29)."""
    from .attention_choice import grouped_decode

    bias = q.new_zeros(1, 1).expand(q.shape[1] // keys.shape[1], keys.shape[2])  # every slot seen
    return grouped_decode("auto", q, keys, values, bias, q.shape[-1] ** -0.5 if scale is None else scale)


def few_queries_cpu(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: int,
    scale: float | None = None,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """A few queries q [1, Hq, T, D] (query t sees slots 0..start + t, or where `visible` [T, S]
    is True: a sliding window, each row holding at least the query's own slot) against keys/values
    [1, Hkv, S, D], as two grouped float32 matmuls. torch's CPU flash kernel parallelises over
    (head, query block), so one query keeps one core busy per head and walks S serially: 2.6 ms
    per layer at S = 4K against 0.37 ms here (bf16, 2 threads, research/drafting/results/cpu_step_costs.md).
    Scores, softmax and the weighted sum run in float32 (the cache is upcast per step: for T <= 8
    that costs less than the kernel's serial walk). The Hq / Hkv query heads of a group share
    their KV head's matmul. Returns [1, Hq, T, D] in q's dtype."""
    _, n_heads, steps, dim = q.shape
    n_kv, slots = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    grouped = q[0].reshape(n_kv, group * steps, dim).float()  # row g * T + t: head (kv, g), query t
    scores = torch.matmul(grouped, keys[0].float().transpose(1, 2))  # [Hkv, group * T, S]
    scores.mul_(dim**-0.5 if scale is None else scale)
    if visible is not None:
        scores.masked_fill_(~visible.repeat(group, 1), float("-inf"))  # row g * T + t takes visible[t]
    elif steps > 1:
        query = torch.arange(steps, device=q.device).repeat(group)[:, None]
        scores.masked_fill_(torch.arange(slots, device=q.device)[None] > start + query, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # every row keeps its own slot: never fully masked
    out = torch.matmul(weights, values[0].float())  # [Hkv, group * T, Dv]
    return out.reshape(1, n_heads, steps, values.shape[-1]).to(q.dtype)


def windowed_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float | None,
    window: int,
    q_positions: torch.Tensor,
    key_positions: torch.Tensor,
) -> torch.Tensor:
    """Causal attention inside a sliding window: query t (position q_positions[t], [T]) sees the
    cached slot s (position key_positions[s], [S]) iff 0 <= q_pos - k_pos < window. Positions,
    not slots: speculative prefill keeps tokens at their original positions in consecutive slots.
    Where the window covers every pair of a prefill step it is plain causal attention (no mask);
    a decode step (T = 1) always masks, so that it never waits for the device to decide."""
    if q.shape[2] > 1 and int(q_positions.max()) - int(key_positions.min()) < window:
        return causal_attention(q, keys, values, scale)
    distance = q_positions[:, None] - key_positions[None, :]  # [T, S]
    mask = (distance >= 0) & (distance < window)
    if not on_cuda(q) and q.shape[2] <= CPU_FEW_QUERIES:  # decode, verify: see few_queries_cpu
        return few_queries_cpu(q, keys, values, 0, scale, visible=mask)
    return F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != keys.shape[1]
    )


def lower_right_causal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Causal attention of the last T of S slots (query t sees slots 0..S - T + t). On a CUDA
    device the kernel probed fastest there (attention_choice.py: lower-right bias with grouped
    heads, or two fused calls merged by log-sum-exp); elsewhere (the simulated-CUDA tests) the
    lower-right causal bias with KV heads expanded."""
    if q.device.type == "cuda":
        from .attention_choice import kernel_for

        return kernel_for("prefix", q, keys, values)(q, keys, values, keys.shape[2] - q.shape[2], scale)
    # imported here: torch.nn.attention.bias imports Triton, which CPU-only runs never need
    from torch.nn.attention.bias import causal_lower_right

    group = q.shape[1] // keys.shape[1]
    if group > 1:
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(
        q, keys, values, attn_mask=causal_lower_right(q.shape[2], keys.shape[2]), scale=scale
    )


def _cpu_flash():
    """torch's CPU flash kernel returning (out, log-sum-exp); a private op, so None where a torch
    build lacks it (the caller then takes the generic masked path)."""
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


def _cpu_prefix_then_causal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float | None = None
) -> torch.Tensor:
    """A query chunk after `start` cached slots, as two fused CPU flash calls merged by their
    log-sum-exp: unmasked over the prefix, causal over the chunk. A boolean mask would make the
    kernel do the full rectangle, ~1.4x the work at 2K over 4K keys."""
    flash = _cpu_flash()
    out_prefix, lse_prefix = flash(q, keys[:, :, :start], values[:, :, :start], 0.0, False, scale=scale)
    out_chunk, lse_chunk = flash(q, keys[:, :, start:], values[:, :, start:], 0.0, True, scale=scale)
    lse = torch.logaddexp(lse_prefix, lse_chunk)  # float32 softmax statistics [1, Hq, T]
    w_prefix = torch.exp(lse_prefix - lse).unsqueeze(-1)
    w_chunk = torch.exp(lse_chunk - lse).unsqueeze(-1)
    return (out_prefix.float() * w_prefix + out_chunk.float() * w_chunk).to(q.dtype)


TERMS_QUERY_BLOCK = 256  # query rows per block of `terms_attention`: its logits stay [Hq, 256, S]


def terms_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    terms: Any,
    q_positions: torch.Tensor,
    key_positions: torch.Tensor,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of a layer with terms (core/stages.AttentionTerms: a logit soft-cap, per-head
    sinks), which torch's fused kernels do not take: q [1, Hq, T, D] against keys/values
    [1, Hkv, S, D]; query t (position q_positions[t]) sees slot s (key_positions[s]) iff
    0 <= q_pos - k_pos (< window). Explicit float32 logits per block of query rows, as
    transformers' eager function computes them: scaled, soft-capped, masked, the sink as one more
    column of the softmax (dropped after). Returns [1, Hq, T, D] in q's dtype."""
    _, n_heads, steps, dim = q.shape
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    keys_t, vals = keys[0].float().transpose(1, 2), values[0].float()
    sinks = (
        None if terms.sinks is None else terms.sinks.to(device=q.device, dtype=torch.float32).reshape(n_kv, group, 1)
    )
    value_dim = values.shape[-1]  # latent attention's values are narrower than its keys
    out = torch.empty((n_kv, group, steps, value_dim), dtype=torch.float32, device=q.device)
    for lo in range(0, steps, TERMS_QUERY_BLOCK):
        hi = min(lo + TERMS_QUERY_BLOCK, steps)
        rows = q[0, :, lo:hi].float().reshape(n_kv, group * (hi - lo), dim)
        logits = torch.matmul(rows, keys_t).mul_(scale)  # [Hkv, G * rows, S]
        if terms.softcap is not None:
            logits = torch.tanh(logits / terms.softcap) * terms.softcap
        distance = q_positions[lo:hi, None] - key_positions[None, :]
        hidden = distance < 0 if window is None else (distance < 0) | (distance >= window)
        logits.masked_fill_(hidden.repeat(group, 1), float("-inf"))  # row g * rows + t takes hidden[t]
        if sinks is not None:
            column = sinks.expand(n_kv, group, hi - lo).reshape(n_kv, group * (hi - lo), 1)
            weights = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(logits, dim=-1)  # every row keeps its own slot: never fully masked
        out[:, :, lo:hi] = torch.matmul(weights, vals).view(n_kv, group, hi - lo, value_dim)
    return out.reshape(1, n_heads, steps, value_dim).to(q.dtype)
