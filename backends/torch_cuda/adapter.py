"""Take over the attention of a transformers model through its attention interface: one generic
adapter instead of a model file per family.

transformers' attention modules project, normalise and rotate q/k/v themselves (RoPE from the
`position_ids` the model is called with: SpecPrefill's original positions go straight in) and then
call the function that `config._attn_implementation` names in `AttentionInterface`. specfill
registers `specfill_attention` there; during a specfill step (`StepState` set by adapted.py) it
receives each layer's post-RoPE q [1, Hq, T, D] and k/v [1, Hkv, T, D], writes specfill's KV cache,
and attends causally, inside the layer's window, or through the method's `PrefillAttention`
(H2O, the speculator's query capture). Everything else (embeddings, MLP or mixture of experts,
norms, LM head, logit scaling) is transformers' own code.

`describe` learns each layer's attention by one probe call of the model (2 tokens): which module
called the interface from which decoder layer, with which shapes and arguments. Attention sinks
(gpt_oss's `s_aux`, the module's own parameter) and logit soft-capping (gemma2's `softcap`) become
the layer's AttentionTerms, which every method honours (`terms_attention` for a plain step, the
methods' stages otherwise). Multi-head latent attention (deepseek_v3; kimi_k25's text model is
one) reaches the interface decompressed by transformers (keys of qk_nope + qk_rope dims, values of
v_head_dim): its values are zero-padded to the keys' width in specfill's cache (torch's fused
flash kernels and the Triton kernels take one head size; zero columns change no softmax weight,
memory set or score) and every output is cut back to v_head_dim.
Arguments the adapter does not model make the layer's `refusal`; such a
layer still runs full prefill and decoding through its family's own eager attention function on
specfill's cache, with a mask from the cached positions.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specfill.core.adapted import AttentionLayout, checked_terms, terms_kind
from specfill.core.errors import ModelLoadError
from specfill.core.ops import PrefillAttention, checkpoint
from specfill.core.stages import AttentionTerms

from .attention import causal_attention, terms_attention, windowed_attention
from .cache import ModelKVCache

NAME = "specfill"  # the attention implementation's name in transformers' AttentionInterface
# interface arguments that change nothing the adapter does not do itself (or are bookkeeping)
NEUTRAL_ARGUMENTS = frozenset(
    {
        "dropout",
        "scaling",
        "sliding_window",
        "position_ids",
        "use_cache",
        "cache_position",
        "output_router_logits",
        "output_attentions",
        "position_embeddings",
        "past_key_values",
        "layer_idx",
    }
)
# arguments the layer's AttentionTerms take (core/stages.py): per-head sinks [Hq], the logit soft-cap
SINK_ARGUMENTS = ("s_aux", "sinks")
SOFTCAP_ARGUMENT = "softcap"
# argument -> (layer kind, why the methods' stages cannot run it), when its value is not None
REFUSED_ARGUMENTS: dict[str, tuple[str, str]] = {}


@dataclass
class Probe:
    """Recorder of one probe call: (attention module, q/k/v shapes, interface arguments) per call."""

    calls: list[tuple[nn.Module, tuple, tuple, tuple, dict[str, Any]]] = field(default_factory=list)


@dataclass
class StepState:
    """What one specfill step gives every layer: index (id(attention module) -> layer), layouts,
    RoPE positions [T] int64 on the device, the KV cache, and the method's attention (None: causal)."""

    index: dict[int, int]
    layouts: tuple[AttentionLayout, ...]
    positions: torch.Tensor
    cache: ModelKVCache
    attend: PrefillAttention | None = None


ACTIVE: ContextVar[StepState | Probe | None] = ContextVar("specfill_attention_step", default=None)


def specfill_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface call: q [1, Hq, T, D], k/v [1, Hkv, T, D] of the step
    (post-RoPE) -> ([1, T, Hq, D], None). transformers' mask is not used (none is built for this
    implementation): causality and windows come from the step's positions and the cache."""
    step = ACTIVE.get()
    if isinstance(step, Probe):
        step.calls.append((module, tuple(query.shape), tuple(key.shape), tuple(value.shape), dict(kwargs)))
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None
    if step is None:
        raise RuntimeError(f"attention implementation {NAME!r} runs only inside a specfill step")
    checkpoint()  # a cancelled request (core/ops.py) stops at the next layer's attention
    index = step.index[id(module)]
    layout, positions = step.layouts[index], step.positions
    layer_cache = step.cache.layer_cache(index) if hasattr(step.cache, "layer_cache") else step.cache.layers[index]
    value_dim = value.shape[-1]
    if value_dim < key.shape[-1]:  # latent attention: values zero-padded to the keys' head dim (module doc)
        value = F.pad(value, (0, key.shape[-1] - value_dim))
    keys, values = layer_cache.update_and_fetch(key, value)
    keys_at = layer_cache.slot_positions(positions)  # every layer records them: windows and refused layers read them
    if layout.refusal is not None:
        out = _own_attention(module, query, keys, values, positions, keys_at, layout, kwargs)
        return out[..., :value_dim].contiguous(), None
    if step.attend is not None:
        out = step.attend(index, query, keys, values)
    elif layout.terms is not None:
        out = terms_attention(query, keys, values, layout.scale, layout.terms, positions, keys_at, layout.window)
    elif layout.window is not None:
        out = windowed_attention(query, keys, values, layout.scale, layout.window, positions, keys_at)
    else:
        out = causal_attention(query, keys, values, layout.scale)
    return out[..., :value_dim].transpose(
        1, 2
    ).contiguous(), None  # contiguous as transformers own functions return it (views follow)


def _own_attention(
    module: nn.Module,
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    keys_at: torch.Tensor,
    layout: AttentionLayout,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """A refused layer's attention by its family's own `eager_attention_forward` (whatever it
    adds to the softmax included) over every cached key, with an additive mask [1, 1, T, S] from the
    positions: query t sees slot s iff 0 <= positions[t] - keys_at[s] (< window). -> [1, T, Hq, D]."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward")
    distance = positions[:, None] - keys_at[None, :]
    visible = distance >= 0
    if layout.window is not None:
        visible &= distance < layout.window
    mask = torch.zeros(visible.shape, dtype=query.dtype, device=query.device)
    mask.masked_fill_(~visible, torch.finfo(query.dtype).min)
    arguments = {name: value for name, value in kwargs.items() if name not in ("scaling", "dropout")}
    out, _ = eager(module, query, keys, values, mask[None, None], scaling=layout.scale, dropout=0.0, **arguments)
    return out


def register() -> None:
    """Register `specfill_attention` in transformers' AttentionInterface (idempotent). No mask
    function is registered: transformers then builds no mask for this implementation."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, specfill_attention)


def _refusal(kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """(layer kind, reason) for interface arguments or shapes the adapter does not model."""
    for name, refused in REFUSED_ARGUMENTS.items():
        if kwargs.get(name) is not None:
            return refused
    modelled = NEUTRAL_ARGUMENTS | set(SINK_ARGUMENTS) | {SOFTCAP_ARGUMENT}  # the terms: terms_of
    unknown = sorted(
        name
        for name, value in kwargs.items()
        if name not in modelled
        and value is not None
        and value is not False
        and not (name == "is_causal" and value is True)
    )
    if unknown:
        return "attention of an unknown layout", f"interface arguments the adapter does not model: {', '.join(unknown)}"
    return None


def terms_of(kwargs: dict[str, Any], n_heads: int) -> tuple[AttentionTerms | None, str | None]:
    """(the layer's AttentionTerms or None, a refusal reason or None) from its interface arguments:
    sinks, the library's own [Hq] parameter (read at each step: weights loaded later count), and a
    positive soft-cap."""
    sinks = next((kwargs[name] for name in SINK_ARGUMENTS if kwargs.get(name) is not None), None)
    # the parameter itself, not a copy: a later load or move of the weights is what the steps read
    return checked_terms(sinks, kwargs.get(SOFTCAP_ARGUMENT), n_heads, torch.Tensor)


def layout_of(
    call: tuple[nn.Module, tuple, tuple, tuple, dict[str, Any]], config_refusal: tuple[str, str] | None, eps: float
) -> AttentionLayout:
    """One probe call (module, q/k/v shapes [1, H, 2, D], arguments) as the layer's AttentionLayout."""
    module, q, k, v, kwargs = call
    n_heads, n_kv, head_dim = q[1], k[1], q[3]
    scale = kwargs.get("scaling")
    scale = float(head_dim**-0.5 if scale is None else scale)
    window = kwargs.get("sliding_window")
    window = int(window) if isinstance(window, int) and not isinstance(window, bool) else None
    refusal = config_refusal or _refusal(kwargs)
    terms, odd_terms = terms_of(kwargs, n_heads)
    if refusal is None and odd_terms is not None:
        refusal = "attention of an unknown layout", odd_terms
    latent = v[3] < k[3]  # multi-head latent attention: values narrower than keys
    kind = f"{'multi-head latent attention' if latent else terms_kind(terms)} ({type(module).__name__})"
    if refusal is not None:
        kind, terms = f"{refusal[0]} ({type(module).__name__})", None
    return AttentionLayout(
        kind,
        n_heads,
        n_kv,
        head_dim,
        scale,
        window=window,
        refusal=None if refusal is None else refusal[1],
        norm_eps=eps,
        value_dim=v[3] if latent else None,
        terms=terms,
    )


def check_cacheable(architecture: str, calls: list) -> None:
    """specfill's torch KV cache holds one [Hkv, D] shape for keys and values of every layer (values
    of a smaller head dim, latent attention's, are zero-padded to it): layers whose key shape
    differs across layers, or whose values are wider than keys, are refused at load, every method,
    with the first such layer named."""
    first = calls[0][2]
    for index, (module, q, k, v, _) in enumerate(calls):
        if v[3] > k[3] or (k[1], k[3]) != (first[1], first[3]):
            kind = "attention of another KV shape"
            raise ModelLoadError(
                f"{architecture} layer {index} is {kind} ({type(module).__name__}: keys "
                f"[{k[1]}, {k[3]}], values [{v[1]}, {v[3]}] per token): specfill's torch KV cache "
                f"holds one key/value shape for every layer; every method is refused, use "
                f"transformers itself"
            )
