"""A backend-neutral description of a model whose attention specfill takes over from another library.

A backend's adapter (backends/mlx/adapter.py for mlx-lm models) walks a library model's decoder
layers and describes each layer's attention as an `AttentionLayout`: head counts, head dim, the
softmax scale, how q/k/v are projected and normalised, whether RoPE rotates them, the sliding
window, and, where the layer does something the methods' stages do not model, why. The model's
own code still runs everything else (embeddings, MLP or mixture of experts, norms, LM head).

`AdaptedArgs` carries what the generation driver and the methods read from a model's args
(the same names as core/models.ModelArgs), so core/methods and core/driver.py run unchanged.

Refusals are per layer and per method: full prefill and decode run a refused layer through the
library's own attention (positions = cache slots), while H2O and SpecPrefill, which replace the
attention (H2O) or feed non-contiguous positions and capture queries (SpecPrefill), are refused
with one error naming the architecture, the layer, its kind and the method.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ConfigError
from .stages import AttentionTerms

QK_NORMS = ("none", "head", "full", "weightless")  # per head, over all heads at once, RMS without weight
METHOD_NAMES = {"h2o": "H2O", "specprefill": "SpecPrefill", "speculator": "the SpecPrefill speculator"}


class MethodRefusedError(ConfigError):
    """A method that the model's architecture cannot honour (named layer, kind and method)."""


def terms_kind(terms: AttentionTerms[Any] | None, base: str = "attention") -> str:
    """How a report names a layer with these terms: "attention", "attention with sinks", ..."""
    if terms is None:
        return base
    named = [
        name
        for name, present in (("sinks", terms.sinks is not None), ("logit soft-capping", terms.softcap is not None))
        if present
    ]
    return f"{base} with " + " and ".join(named) if named else base


def checked_terms(
    sinks: Any, softcap: Any, n_heads: int, array_type: type[Any]
) -> tuple[AttentionTerms[Any] | None, str | None]:
    """(a layer's AttentionTerms or None, a refusal reason or None) from what its library holds: sinks,
    one per query head (an `array_type`: the library's own array, not a copy), and a positive soft-cap."""
    if sinks is None and softcap is None:
        return None, None
    if sinks is not None and not isinstance(sinks, array_type):
        return None, f"attention sinks held as {type(sinks).__name__}, not an array of the library's"
    if sinks is not None and tuple(sinks.shape) != (n_heads,):
        return None, f"attention sinks of shape {tuple(sinks.shape)}, not one per query head"
    if softcap is not None and not (
        isinstance(softcap, (int, float)) and not isinstance(softcap, bool) and softcap > 0
    ):
        return None, f"a logit soft-cap of {softcap!r}, not a positive number"
    return AttentionTerms(sinks, None if softcap is None else float(softcap)), None


@dataclass(frozen=True)
class AttentionLayout:
    """One decoder layer's attention, as the adapter runs it.

    kind: what the layer is, for reports ("attention", "attention (NoPE)", "attention sinks", ...).
    fused_qkv: one projection yields q, k and v ([Hq + 2 Hkv] * D outputs, in that order).
    qk_norm: "none", "head" (RMSNorm over each head's D, before RoPE), "full" (over all heads'
    Hq * D / Hkv * D before the split into heads) or "weightless" (RMS without a weight, per head).
    rope: RoPE rotates q and k (False: NoPE, the layer attends by content alone).
    window: sliding window w (query at position p sees keys at p - w < q <= p), None: global.
    terms: what the layer adds to its softmax (core/stages.AttentionTerms: gpt_oss's per-head
    sinks, the library's own parameter array; gemma2's logit soft-cap), None: nothing; every
    method honours them (not compared: an array).
    value_dim: multi-head latent attention's value head dim (deepseek_v3, kimi_k25: keys and
    queries of qk_nope + qk_rope dims, values of v_head_dim, both decompressed from a latent); the
    methods take such values as they come (core/stages.py), None: values of head_dim.
    refusal: why the sparse methods cannot run this layer (None: they can); full prefill and
    decode then go through the library's own attention module.
    output_gate: the query projection yields, per head, D query features then D gate features, and
    the attention output is multiplied by sigmoid(gate) before the output projection (Qwen3-Next,
    Qwen3.5).
    recurrent: a linear-attention / state-space layer (no keys: its state is the library's own,
    read token by token in order); the methods skip it (docs/methods.md, Hybrid models).
    stateless: a layer that keeps nothing between steps (Nemotron-H's MLP / MoE blocks); skipped too.
    parallel: an attention layer with a recurrent mixer beside it on the same input (Falcon-H1):
    the methods run its attention, the mixer runs unchanged and keeps its own state.
    v_norm: an RMS norm without weight over each value head, applied before the values are cached
    (Gemma 4): the methods see the cached values, so it is part of the projection.
    k_eq_v: the values are the key projection's output (before the key norm and RoPE; Gemma 4's
    full-attention layers with attention_k_eq_v).
    kv_source: a KV-shared layer (Gemma 4's has_kv False): it keeps no cache and attends with its own
    queries over layer kv_source's cached keys and values (the same arrays); None: its own.
    """

    kind: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    fused_qkv: bool = False
    qk_norm: str = "none"
    rope: bool = True
    window: int | None = None
    refusal: str | None = None
    norm_eps: float = 1e-6  # the epsilon of a "weightless" q/k norm (a norm module keeps its own)
    value_dim: int | None = None  # latent attention: the values' own head dim (None: head_dim)
    output_gate: bool = False
    recurrent: bool = False
    stateless: bool = False
    parallel: bool = False
    v_norm: bool = False
    k_eq_v: bool = False
    kv_source: int | None = None
    terms: AttentionTerms[Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.qk_norm not in QK_NORMS:
            raise ConfigError(f"qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}")
        if self.kv_source is not None and self.kv_source < 0:
            raise ConfigError(f"kv_source must be a layer index, got {self.kv_source}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{self.n_heads} query heads are not a multiple of {self.n_kv_heads} KV heads")


@dataclass(frozen=True)
class AdaptedArgs:
    """The model-level numbers the driver and methods read (core/models.ModelArgs' names), with one
    AttentionLayout per decoder layer. architecture: the library's model type ("qwen3_moe", ...)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    layers: tuple[AttentionLayout, ...]
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with keys (every layer but a hybrid's recurrent and stateless ones): what the methods run."""
        return tuple(i for i, layer in enumerate(self.layers) if not (layer.recurrent or layer.stateless))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """The layers that keep a recurrent state (beside attention too: `parallel`)."""
        return tuple(i for i, layer in enumerate(self.layers) if layer.recurrent or layer.parallel)

    @property
    def hybrid(self) -> bool:
        """Some layer keeps a recurrent state or nothing: the model needs a hybrid cache."""
        return any(layer.recurrent or layer.parallel or layer.stateless for layer in self.layers)

    @property
    def _first(self) -> AttentionLayout:
        """The first attention layer (a hybrid's layer 0 may be recurrent)."""
        attention = self.attention_layers
        return self.layers[attention[0] if attention else 0]

    @property
    def num_attention_heads(self) -> int:
        return self._first.n_heads

    @property
    def num_key_value_heads(self) -> int:
        return self._first.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self._first.head_dim

    @property
    def attention_scale(self) -> float:
        """The one softmax scale the methods use for every attention layer (`refusal` otherwise)."""
        return self._first.scale

    def layer_window(self, layer: int) -> int | None:
        return self.layers[layer].window

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(layer.window for layer in self.layers)

    @property
    def layer_terms(self) -> tuple[AttentionTerms[Any] | None, ...]:
        """Each layer's attention terms (sinks, soft-cap), as layer_windows are its windows."""
        return tuple(layer.terms for layer in self.layers)

    def first(self, n_layers: int) -> AdaptedArgs:
        """The args of the model's first n_layers layers (the "self:K" speculator)."""
        return replace(self, layers=self.layers[:n_layers])

    def refusal(self, method: str | None = None) -> str | None:
        """Why `method` ("h2o", "specprefill": the main model, "speculator") cannot run this model
        (the first refusing layer), or None; method None: why some of them cannot (the strictest).

        Besides a layer's own refusal, the methods need one softmax scale across the attention
        layers (H2O's stages and SpecPrefill's scoring take one). H2O and SpecPrefill's main pass
        run each layer on its own q/k/v, so layers may differ in head counts and head dims
        (Gemma 4's wider full-attention heads); the speculator's scoring stacks every scored
        layer's queries, so it needs one head count and head dim. Recurrent layers are no refusal:
        the methods run them unchanged."""
        for index, layer in enumerate(self.layers):
            if layer.refusal is not None and index in self.attention_layers:
                return f"layer {index} ({layer.kind}): {layer.refusal}"
        if not self.attention_layers:
            return "its layers are all recurrent: no keys to run a method over"
        first = self._first
        for index, layer in ((i, self.layers[i]) for i in self.attention_layers):
            shape = (layer.n_heads, layer.n_kv_heads, layer.head_dim, layer.value_dim)
            if abs(layer.scale - first.scale) > 1e-12 * abs(first.scale):
                return f"layer {index} ({layer.kind}): its softmax scale differs from layer 0's"
            stacked = method in (None, "speculator")  # the scoring's stack of every layer's queries
            if stacked and shape != (first.n_heads, first.n_kv_heads, first.head_dim, first.value_dim):
                return (
                    f"layer {index} ({layer.kind}): its head counts or head dim differ from layer 0's "
                    f"(the speculator's scoring stacks every scored layer's queries)"
                )
        return None

    def check_attend(self, attend: Any, specprefill_step: bool = False) -> None:
        """Refuse by name (MethodRefusedError), before anything runs, a step's method the model's layers
        cannot honour: H2O's prefill attention, the speculator's query capture (and H2O where its prompt
        pass runs H2O), SpecPrefill's main pass where `specprefill_step` (kept tokens at their original
        positions, for a backend whose refused layers cannot run it), any other `attend` but None."""
        from .methods.h2o import H2OPrefillAttention  # lazy: the methods load with a method's first step
        from .methods.specprefill import QueryCapture

        if isinstance(attend, H2OPrefillAttention):
            self.check_method("h2o")
        elif isinstance(attend, QueryCapture):
            self.check_method("speculator")
            if attend.prompt_attend is not None:  # SpecPrefill over an H2O speculator: its prompt pass runs H2O
                self.check_method("h2o")
        elif specprefill_step:
            self.check_method("specprefill")
        elif attend is not None:
            raise MethodRefusedError(f"{type(attend).__name__} is not a method the adapter knows")

    def check_method(self, method: str) -> None:
        """Raise MethodRefusedError when `method` ("h2o", "specprefill", "speculator") cannot run."""
        reason = self.refusal(method)
        if reason is not None:
            raise MethodRefusedError(
                f"{METHOD_NAMES.get(method, method)} cannot run on {self.architecture}: "
                f"{reason} (full prefill and decoding work on it)"
            )
