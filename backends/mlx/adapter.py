"""Take over the attention of an mlx-lm model's layers: one generic adapter instead of a model file
per family.

`describe_layer` reads one decoder layer of an mlx-lm model (its attention module's parts and
settings, the model's config) into a core/adapted.AttentionLayout. `AdaptedAttention` replaces the
layer's attention module: it runs the module's own projections, q/k norms and RoPE module, but
at the positions the step gives (an int, or one per token: SpecPrefill's original positions),
writes specfill's KV cache and attends causally, inside the layer's window, or through the
method's `PrefillAttention` (H2O, the speculator's query capture). Everything around the
attention (embeddings, MLP / mixture of experts, norms, LM head) stays mlx-lm's own code.

Attention sinks (gpt_oss's `sinks` array, one per query head) and logit soft-capping (gemma2's
attn_logit_softcapping) become the layer's AttentionTerms (core/stages.py), which every method
honours (`terms_attention` for a plain step, the methods' stages otherwise); the sinks are the
module's array at adapt time (adapt after the weights are loaded: loader.py does).
Multi-head latent attention (deepseek_v3, kimi_k25's text model) is run decompressed: mlx-lm's
module caches the latent and absorbs the up-projections; the adapter instead forms each head's
keys [q_nope dims: embed_q of the latent; q_rope dims: the shared RoPE key] and values (unembed_out
of the latent, v_head_dim wide) and caches those, so that every method sees plain q, k, v with
values narrower than keys (the same logits: scale * (q_nope . k_nope + q_pe . k_pe)).
Gemma 4: the value norm and k = v are part of the projection (the methods see the cached values);
a KV-shared layer (has_kv False) caches nothing and attends with its own queries over its source
layer's cached keys and values, which the layers hand along (mlx-lm's shared_kv); its key positions
come from the step state (docs/models.md, Gemma 4).
What the adapter does not model is refused, never approximated: a part or setting it does not
know makes the layer's `refusal`; such a layer runs through its original
module for full prefill and decode (positions = slots).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specfill.core.adapted import AttentionLayout, checked_terms, terms_kind
from specfill.core.stages import AttentionTerms

from .cache import LayerKVCache
from .model import causal_attention, layer_boundary, terms_attention, windowed_attention

ATTENTION_NAMES = ("self_attn", "attention", "attn")  # the attention child of a decoder layer
KNOWN_PARTS = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_norm", "k_norm", "v_norm", "rope", "sinks"}
)  # sinks: the layer's AttentionTerms; v_norm: Gemma 4's norm of the values before they are cached
SOFTCAP_SETTING = "attn_logit_softcapping"  # the layer's AttentionTerms
# part or setting -> (layer kind, why the methods' stages cannot run it)
# multi-head latent attention as mlx-lm's deepseek_v3 writes it (a q LoRA or not), and its settings
LATENT_PARTS = frozenset(
    {"q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "embed_q"}
    | {"unembed_out", "o_proj", "rope"}
)
LATENT_SETTINGS = frozenset(
    {"q_lora_rank", "qk_rope_head_dim", "kv_lora_rank", "v_head_dim", "qk_nope_head_dim", "q_head_dim"}
)
REFUSED_PARTS = {
    "kv_a_proj_with_mqa": (
        "multi-head latent attention",
        "keys and values are decompressed from a shared latent, with a RoPE part apart",
    ),
    "kv_b_proj": (
        "multi-head latent attention",
        "keys and values are decompressed from a shared latent, with a RoPE part apart",
    ),
}
REFUSED_SETTINGS: dict[str, tuple[str, str]] = {}
NOT_MIXERS = frozenset(
    {"mlp", "feed_forward", "block_sparse_moe", "moe", "shared_mlp", "feed_forward_moe"}
)  # a layer's parts besides its mixer
ALIASES = {"q_layernorm": "q_norm", "k_layernorm": "k_norm", "out_proj": "o_proj"}  # LFM2's names
# Switches of parts the adapter does not model that change nothing while False
OFF_SWITCHES = frozenset({"qk_layernorm"})
# Plain settings of mlx-lm attention modules that change nothing the adapter does not read itself.
# Gemma 4's: layer_type ("sliding_attention" / "full_attention": is_sliding says the same), has_kv
# (False: a KV-shared layer, the layout's kv_source), use_k_eq_v (the layout's k_eq_v).
KNOWN_SETTINGS = frozenset(
    (
        "n_heads n_kv_heads num_heads num_attention_heads num_key_value_heads num_kv_heads n_kv_groups use_qk_norm "
        "partial_rotary_factor num_key_value_groups head_dim scale sm_scale repeats layer_idx args config "
        "hidden_size hidden_dim rope_theta num_hidden_layers is_sliding is_local use_rope use_sliding "
        "max_position_embeddings rms_norm_eps layer_type has_kv use_k_eq_v"
    ).split()
    + [SOFTCAP_SETTING]
)


class StepState:
    """What the current forward step gives every adapted layer: RoPE positions (an int, the first
    of consecutive ones, or host int64 [T]) and the method's attention (None: causal). `positions`
    None: no adapted step is running (mlx-lm's own calls go to the original modules)."""

    def __init__(self) -> None:
        self.positions: int | np.ndarray | None = None
        self.attend: Any = None
        self.keys_at: dict[int, np.ndarray | None] = {}  # this step's key positions per layer (KV sharing)


def settings(module: nn.Module) -> dict[str, Any]:
    """A module's plain (non-array, non-module) attributes, without MLX's own bookkeeping."""
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def attention_of(layer: nn.Module) -> tuple[str, nn.Module] | None:
    """(name, module) of a decoder layer's softmax-attention child, None when it has none."""
    children = layer.children()
    for name in ATTENTION_NAMES:
        if name in children and isinstance(children[name], nn.Module):
            return name, children[name]
    mixer = children.get("mixer")  # Nemotron-H: one `mixer` child per block, attention or not
    if isinstance(mixer, nn.Module) and {"q_proj", "qkv_proj"} & set(mixer.children()):
        return "mixer", mixer
    return None


def _convolves(layer: nn.Module) -> bool:
    """Whether a layer holds a 1-D convolution: every recurrent mixer mlx-lm has (Mamba, gated
    delta-net, LFM2's short convolution) does; an MLP / MoE block does not."""
    return any(isinstance(module, nn.Conv1d) for _, module in layer.named_modules())


def part(attn: nn.Module, name: str) -> Any:
    """The attention module's child `name`, under its own name or an alias's (ALIASES); None: none."""
    for held in [name] + [alias for alias, canonical in ALIASES.items() if canonical == name]:
        if held in attn:
            return attn[held]
    return None


def _out_features(linear: nn.Module) -> int:
    """Output width of an nn.Linear or nn.QuantizedLinear (both store weight [out, ...])."""
    return int(linear["weight"].shape[0])


def _refusal(parts: set[str], found: dict[str, Any], rope: nn.Module | None) -> tuple[str, str] | None:
    """(layer kind, reason) when the adapter cannot run an attention module with these parts and
    settings, else None."""
    for part in sorted(parts):
        if part in REFUSED_PARTS:
            return REFUSED_PARTS[part]
    for name, refused in REFUSED_SETTINGS.items():
        if found.get(name) is not None:
            return refused
    unknown = sorted(parts - KNOWN_PARTS) + sorted(
        name
        for name in set(found) - KNOWN_SETTINGS - set(REFUSED_SETTINGS)
        if not (name in OFF_SWITCHES and found[name] is False)
    )
    if unknown:
        return "attention of an unknown layout", f"parts or settings the adapter does not model: {', '.join(unknown)}"
    has_kv = found.get("has_kv") is not False  # a KV-shared layer projects queries only
    needed = {"q_proj", "o_proj"} | ({"k_proj"} if has_kv else set())
    needed |= {"v_proj"} if has_kv and not found.get("use_k_eq_v") else set()
    if "qkv_proj" not in parts and not needed <= parts:
        return "attention of an unknown layout", "no q/k/v/o projections the adapter recognises"
    if rope is not None and "Dynamic" in type(rope).__name__:
        return "dynamic RoPE", "its frequencies depend on the sequence length, not on each position"
    return None


def _terms(attn: nn.Module, own: dict[str, Any], n_heads: int) -> tuple[AttentionTerms | None, str | None]:
    """(the layer's AttentionTerms or None, a refusal reason or None): the module's sinks array
    (one per query head) and its positive logit soft-cap."""
    return checked_terms(attn.get("sinks") if "sinks" in attn else None, own.get(SOFTCAP_SETTING), n_heads, mx.array)


def describe_layer(config: dict[str, Any], index: int, layer: nn.Module) -> AttentionLayout:
    """Layer `index`'s attention as an AttentionLayout (config: the mlx-lm model's args as a dict)."""
    found = attention_of(layer)
    if found is not None and _convolves(found[1]):  # linear attention under an attention name
        found = None
    if found is None:
        mixers = [name for name in sorted(layer.children()) if "norm" not in name and name not in NOT_MIXERS]
        named = ", ".join(type(layer[m]).__name__ for m in mixers) or "no mixer"
        if not _convolves(layer):
            return AttentionLayout(f"stateless ({named})", 1, 1, 2, 1.0, stateless=True)
        return AttentionLayout(f"recurrent ({named})", 1, 1, 2, 1.0, recurrent=True)
    _, attn = found
    parts = {ALIASES.get(name, name) for name in attn.children()}
    parts |= {name for name, value in attn.items() if isinstance(value, mx.array)}
    own = settings(attn)
    rope = attn.children().get("rope")
    if {"kv_a_proj_with_mqa", "embed_q", "unembed_out"} <= parts:
        return _describe_latent(config, index, layer, attn, parts, own)
    refusal = _refusal(parts, own, rope if isinstance(rope, nn.Module) else None)
    n_heads = int(
        own.get("n_heads") or own.get("num_heads") or own.get("num_attention_heads") or config["num_attention_heads"]
    )
    n_kv = int(
        own.get("n_kv_heads")
        or own.get("num_key_value_heads")
        or own.get("num_kv_heads")
        or config.get("num_key_value_heads")
        or n_heads
    )
    scale = own.get("scale", own.get("sm_scale"))
    window = _window(config, own, settings(layer), index)
    if refusal is None and scale is None:
        refusal = "attention of an unknown layout", "no softmax scale found"
    if refusal is not None:
        return AttentionLayout(refusal[0], n_heads, n_kv, 2, float(scale or 1.0), window=window, refusal=refusal[1])
    fused = "qkv_proj" in parts
    width = _out_features(attn["qkv_proj"] if fused else attn["q_proj"])
    head_dim = width // (n_heads + 2 * n_kv) if fused else width // n_heads
    kv_width = None if fused or "k_proj" not in parts else _out_features(attn["k_proj"])
    gated = kv_width is not None and own.get("head_dim") == kv_width // n_kv and width == 2 * n_heads * own["head_dim"]
    if gated:  # q_proj yields each head's queries, then its output gate (Qwen3-Next, Qwen3.5)
        head_dim = width // (2 * n_heads)
    qk_norm = _qk_norm(attn, own, n_heads, head_dim)
    uses_rope = "rope" in parts and not _is_nope(rope)
    layout = dict(
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        scale=float(scale),
        fused_qkv=fused,
        rope=uses_rope,
        window=window,
        norm_eps=float(own.get("rms_norm_eps") or config.get("rms_norm_eps") or 1e-6),
        output_gate=gated,
        v_norm="v_norm" in parts,
        k_eq_v=bool(own.get("use_k_eq_v")),
    )
    if own.get("has_kv") is False:  # Gemma 4's KV-shared layer: the backbone names the layer it reads
        sources = config.get("previous_kvs") or ()
        source = sources[index] if index < len(sources) else None
        if not isinstance(source, int) or not 0 <= source < index:
            return AttentionLayout(
                "attention of an unknown layout",
                **layout,
                refusal="a KV-shared layer whose source layer the model does not name",
            )
        layout["kv_source"] = source
    if qk_norm == "?" or (kv_width is not None and kv_width != n_kv * head_dim) or head_dim % 2:
        return AttentionLayout(
            "attention of an unknown layout",
            **layout,
            refusal="projection or q/k norm shapes the adapter does not recognise",
        )
    terms, odd_terms = _terms(attn, own, n_heads)
    if odd_terms is not None:
        return AttentionLayout("attention of an unknown layout", **layout, refusal=odd_terms)
    kind = terms_kind(terms, "attention" if uses_rope else "attention (NoPE)")
    parallel = _convolves(layer)  # a recurrent mixer beside the attention (Falcon-H1)
    if parallel:
        kind += " beside a recurrent mixer"
    return AttentionLayout(kind, **layout, qk_norm=qk_norm, terms=terms, parallel=parallel)


def _describe_latent(
    config: dict[str, Any], index: int, layer: nn.Module, attn: nn.Module, parts: set[str], own: dict[str, Any]
) -> AttentionLayout:
    """A multi-head latent attention module (mlx-lm's deepseek_v3 layout) as its decompressed
    AttentionLayout: one KV head per query head, keys of qk_nope + qk_rope dims, values of v_head_dim."""
    n_heads = int(own.get("num_heads") or config["num_attention_heads"])
    nope, rope_dim, value_dim = (
        int(own.get(name) or 0) for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    )
    window = _window(config, own, settings(layer), index)
    layout = dict(window=window, value_dim=value_dim, norm_eps=float(config.get("rms_norm_eps") or 1e-6))
    kind, scale = "multi-head latent attention", float(own.get("scale") or 1.0)
    unknown = sorted(parts - LATENT_PARTS) + sorted(
        set(own) - KNOWN_SETTINGS - LATENT_SETTINGS
    )  # e.g. deepseek_v32's indexer
    rope = attn.children().get("rope")
    layout["rope"] = rope is not None  # kimi_linear's latent layers: no RoPE, the "rope" part unrotated
    if unknown or not (nope and rope_dim and value_dim) or "scale" not in own:
        reason = f"parts or settings the adapter does not model: {', '.join(unknown) or 'head dims, scale'}"
        return AttentionLayout(kind, n_heads, n_heads, 2, scale, refusal=reason, **layout)
    if rope is not None and "Dynamic" in type(rope).__name__:
        reason = "dynamic RoPE: its frequencies depend on the sequence length, not on each position"
        return AttentionLayout(kind, n_heads, n_heads, 2, scale, refusal=reason, **layout)
    return AttentionLayout(kind, n_heads, n_heads, nope + rope_dim, scale, **layout)


def _is_nope(rope: Any) -> bool:
    """mlx-lm's identity stand-in for RoPE on NoPE layers (SmolLM3)."""
    from mlx_lm.models.smollm3 import NoPE

    return isinstance(rope, NoPE)


def _qk_norm(attn: nn.Module, own: dict[str, Any], n_heads: int, head_dim: int) -> str:
    """How the module normalises q and k before RoPE: "head" (a q_norm whose weight is [D] or
    [Hq, D], applied to [1, T, H, D]), "full" (weight [Hq * D], before the split into heads),
    "weightless" (use_qk_norm without a norm module: RMS per head), "none", or "?" (unknown)."""
    if part(attn, "q_norm") is None:
        return "weightless" if own.get("use_qk_norm") else "none"
    weight = part(attn, "q_norm").get("weight")
    shape = None if weight is None else tuple(weight.shape)
    if shape in ((head_dim,), (n_heads, head_dim)):
        return "head"
    return "full" if shape == (n_heads * head_dim,) else "?"


def _window(config: dict[str, Any], attn: dict[str, Any], block: dict[str, Any], index: int) -> int | None:
    """The layer's sliding window as mlx-lm applies it: the attention's or block's own flag
    (is_sliding, is_local, use_sliding), else the config's layer_types, else global."""
    window = config.get("sliding_window")
    for flag in (attn.get("is_sliding"), attn.get("is_local"), attn.get("use_sliding"), block.get("use_sliding")):
        if flag is not None:
            return int(window) if flag and window else None
    types = config.get("layer_types")
    if types and window and types[index] == "sliding_attention":
        return int(window)
    return None


class AdaptedAttention(nn.Module):
    """One layer's attention run by specfill around the original module's parts (`inner`).

    Called by the mlx-lm layer as its attention: (x [1, T, hidden], mask, cache) -> [1, T, hidden].
    The mask is mlx-lm's and is not used: positions and windows come from `step_state` and the cache.
    """

    def __init__(self, inner: nn.Module, layout: AttentionLayout, index: int, state: StepState):
        super().__init__()
        self.inner = inner
        self.layout = layout
        self.index = index
        self.step_state = state

    def __getattr__(self, name: str) -> Any:
        """The original module's settings (mlx-lm's layers and backbones read some: is_local, ...)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = dict.get(self, "inner")
            if inner is None:
                raise
            return getattr(inner, name)

    def _rope(self, x: mx.array, positions: int | np.ndarray) -> mx.array:
        """x [1, T, H, D] (token-major) -> [1, H, T, D], rotated by the module's RoPE at `positions`
        (per token: each token becomes its own batch row, whose offset is its position)."""
        if not self.layout.rope:
            return x.swapaxes(1, 2)
        rope = self.inner["rope"]
        if isinstance(positions, (int, np.integer)):
            return rope(x.swapaxes(1, 2), offset=int(positions))
        _, steps, heads, dim = x.shape
        rotated = rope(x.reshape(steps, heads, 1, dim), offset=mx.array(positions.astype(np.int32)))
        return rotated.reshape(1, steps, heads, dim).swapaxes(1, 2)

    def project_latent(self, x: mx.array, positions: int | np.ndarray) -> tuple[mx.array, mx.array, mx.array]:
        """Latent attention decompressed: x [1, T, hidden] -> q and k [1, H, T, nope + rope] (their
        RoPE parts rotated; the RoPE key shared by every head), v [1, H, T, v_head_dim]."""
        inner, steps, heads = self.inner, x.shape[1], self.layout.n_heads
        nope = int(inner.qk_nope_head_dim)
        q = inner["q_proj"](x) if "q_proj" in inner else inner["q_b_proj"](inner["q_a_layernorm"](inner["q_a_proj"](x)))
        q = q.reshape(1, steps, heads, self.layout.head_dim)
        compressed, k_pe = mx.split(inner["kv_a_proj_with_mqa"](x), [int(inner.kv_lora_rank)], axis=-1)
        latent = inner["kv_a_layernorm"](compressed)[:, None]  # [1, 1, T, kv_lora_rank]
        q_pe = self._rope(q[..., nope:], positions)  # [1, H, T, rope]
        k_pe = self._rope(k_pe.reshape(1, steps, 1, -1), positions)  # [1, 1, T, rope]
        k_nope = inner["embed_q"](latent, transpose=False)  # [1, H, T, nope]
        q = mx.concatenate([q[..., :nope].swapaxes(1, 2), q_pe], axis=-1)
        k = mx.concatenate([k_nope, mx.broadcast_to(k_pe, (*k_nope.shape[:3], k_pe.shape[-1]))], axis=-1)
        return q, k, inner["unembed_out"](latent)

    def project(self, x: mx.array, positions: int | np.ndarray) -> tuple[mx.array, mx.array, mx.array]:
        """x [1, T, hidden] -> q [1, Hq, T, D], k and v [1, Hkv, T, D] (q, k normalised and rotated)."""
        return self._project(x, positions)[:3]

    def _project(self, x: mx.array, positions: int | np.ndarray) -> tuple[mx.array, mx.array, mx.array, Any]:
        """project's q, k, v and the output gate [1, T, Hq * D] (None: the layer has none)."""
        if self.layout.value_dim is not None:
            return (*self.project_latent(x, positions), None)
        layout, inner, steps = self.layout, self.inner, x.shape[1]
        q_width, kv_width = layout.n_heads * layout.head_dim, layout.n_kv_heads * layout.head_dim
        gate = None
        if layout.fused_qkv:
            qkv = inner["qkv_proj"](x)
            q, k, v = qkv[..., :q_width], qkv[..., q_width : q_width + kv_width], qkv[..., q_width + kv_width :]
        elif layout.kv_source is not None:  # a KV-shared layer: its queries only (the keys are the source's)
            q = inner["q_proj"](x).reshape(1, steps, layout.n_heads, layout.head_dim)
            q = part(inner, "q_norm")(q) if layout.qk_norm == "head" else q
            return self._rope(q, positions), None, None, None
        else:
            q, k = inner["q_proj"](x), inner["k_proj"](x)
            v = k if layout.k_eq_v else inner["v_proj"](x)  # k = v: the key projection before its norm
        if layout.output_gate:
            q, gate = mx.split(q.reshape(1, steps, layout.n_heads, 2 * layout.head_dim), 2, axis=-1)
            gate = gate.reshape(1, steps, q_width)
        if layout.qk_norm == "full":
            q, k = part(inner, "q_norm")(q), part(inner, "k_norm")(k)
        q = q.reshape(1, steps, layout.n_heads, layout.head_dim)
        k = k.reshape(1, steps, layout.n_kv_heads, layout.head_dim)
        if layout.qk_norm == "head":
            q, k = part(inner, "q_norm")(q), part(inner, "k_norm")(k)
        elif layout.qk_norm == "weightless":
            q, k = mx.fast.rms_norm(q, None, layout.norm_eps), mx.fast.rms_norm(k, None, layout.norm_eps)
        v = v.reshape(1, steps, layout.n_kv_heads, layout.head_dim)
        v = (part(inner, "v_norm")(v) if layout.v_norm else v).swapaxes(1, 2)  # before the cache: methods see it
        return self._rope(q, positions), self._rope(k, positions), v, gate

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None, **extra: Any) -> Any:
        """The attended output [1, T, hidden]; under Gemma 4's call (shared_kv and offset passed
        along the layers) the tuple (output, (keys, values), offset) its decoder layer expects."""
        layer_boundary(x)  # a cancelled request stops here, before this layer's attention
        positions = self.step_state.positions
        sharing = set(extra) == {"shared_kv", "offset"}  # Gemma 4's layers pass a source's keys along
        if positions is None or self.layout.refusal is not None or (extra and not sharing):
            return self.inner(x, mask=mask, cache=cache, **extra)
        q, k, v, gate = self._project(x, positions)
        window, terms, steps = self.layout.window, self.layout.terms, x.shape[1]
        step = keys_at = None
        if window is not None or terms is not None:  # every step records its positions, whoever attends
            step = (
                np.arange(positions, positions + steps)
                if isinstance(positions, (int, np.integer))
                else np.asarray(positions)
            )
            keys_at = step
        if self.layout.kv_source is not None:  # the source layer's cached keys, values and their positions
            if extra.get("shared_kv") is None:
                raise ValueError(f"layer {self.index} shares layer {self.layout.kv_source}'s keys but got none")
            k, v = extra["shared_kv"]
            keys_at = self.step_state.keys_at.get(self.layout.kv_source) if step is not None else None
        elif isinstance(cache, LayerKVCache):
            k, v = cache.update_and_fetch(k, v)
            keys_at = cache.slot_positions(step) if step is not None else None
        self.step_state.keys_at[self.index] = keys_at
        if self.step_state.attend is not None:
            attended = self.step_state.attend(self.index, q, k, v)
        elif terms is not None:
            attended = terms_attention(q, k, v, self.layout.scale, terms, step, keys_at, window)
        elif window is not None:
            attended = windowed_attention(q, k, v, self.layout.scale, window, step, keys_at)
        else:
            attended = causal_attention(q, k, v, self.layout.scale)
        attended = attended.swapaxes(1, 2).reshape(1, steps, -1)
        out = part(self.inner, "o_proj")(attended if gate is None else attended * mx.sigmoid(gate))
        if not sharing:
            return out
        return out, (k, v), positions if isinstance(positions, (int, np.integer)) else None
