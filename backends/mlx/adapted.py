"""An mlx-lm model run by specfill: its own forward, with every layer's attention adapted.

`adapt(lm)` replaces each decoder layer's attention module with an `AdaptedAttention`
(adapter.py) and returns an `AdaptedModel`: the object `CausalLM` holds, with `AdaptedArgs`
(core/adapted.py) as its args. `AdaptedOps` is MLXOps with the model step going through mlx-lm's
own `Model.__call__` (embeddings, MLP / experts, norms and LM head are mlx-lm's code; mlx-lm's
logits are only computed where the driver asks for them: MLX is lazy). The original modules stay
inside the adapted ones: outside a specfill step the model still runs as mlx-lm's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from specfill.core.adapted import AdaptedArgs
from specfill.core.errors import ModelLoadError

from .adapter import AdaptedAttention, StepState, attention_of, describe_layer
from .cache import LayerKVCache, ModelKVCache, SharedLayerKVCache
from .hybrid_cache import HybridKVCache
from .ops import MLXOps

FLOATS = (mx.float32, mx.float16, mx.bfloat16)


def _backbone(lm: nn.Module) -> nn.Module:
    """The module whose `layers` list the model iterates: the list holding the layers of mlx-lm's
    `Model.layers` (that property may return a slice of it: pipeline-parallel models)."""
    layers = lm.layers
    for _, module in lm.named_modules():
        held = module.get("layers")
        if isinstance(held, list) and len(held) == len(layers) and all(a is b for a, b in zip(held, layers)):
            return module
    raise ModelLoadError(f"{type(lm).__module__}: no module holds the model's layer list")


def _activation_dtype(lm: nn.Module) -> mx.Dtype:
    """The most common floating dtype among the parameters (quantized weights: their scales)."""
    counts = Counter(value.dtype for _, value in tree_flatten(lm.parameters()) if value.dtype in FLOATS)
    return counts.most_common(1)[0][0] if counts else mx.float32


def _config(lm: nn.Module) -> dict[str, Any]:
    """The mlx-lm model's args as a dict; a model wrapping a text model gives its text model's,
    under the outer model type: Qwen3.5's `text_config` (a dict), mlx-lm's kimi_k25 (deepseek_v3
    inside a vision-language wrapper: an args object)."""
    config = dict(vars(lm.args))
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**text, "model_type": config.get("model_type", text.get("model_type"))}
    elif text is not None:
        return {**vars(text), "model_type": config.get("model_type")}
    return config


def _args(lm: nn.Module, layouts: tuple) -> AdaptedArgs:
    config = _config(lm)
    eos = config.get("eos_token_id")
    return AdaptedArgs(
        architecture=str(config.get("model_type", type(lm).__module__.rsplit(".", 1)[-1])),
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        layers=layouts,
        max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
        rms_norm_eps=float(config.get("rms_norm_eps") or 1e-5),
        rope_theta=float(config.get("rope_theta") or 10000.0),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
    )


class AdaptedModel:
    """An mlx-lm model whose layers' attention specfill runs (see the module doc).

    lm: the mlx-lm `Model`; args: its AdaptedArgs; n_layers: run only the first n layers (then
    mlx-lm's final norm and head), the "self:K" speculator view; None: every layer."""

    def __init__(
        self,
        lm: nn.Module,
        args: AdaptedArgs,
        state: StepState,
        n_layers: int | None = None,
        layouts: tuple | None = None,
    ):
        self.lm = lm
        self.args = args
        self.state = state
        self.n_layers = n_layers
        self.dtype = _activation_dtype(lm)
        self._backbone = _backbone(lm)
        self.lm_layouts = layouts if layouts is not None else args.layers  # every layer's, for a view too
        self.stateful = stateful_layers(self.lm_layouts)

    def first_layers(self, n_layers: int) -> AdaptedModel:
        total = len(self.lm.layers)
        if not 1 <= n_layers <= total:
            raise ValueError(f"first_layers takes 1..{total} layers, got {n_layers}")
        return AdaptedModel(self.lm, self.args.first(n_layers), self.state, n_layers, self.lm_layouts)

    def step(self, ids: mx.array, positions, cache, attend, logits_from: int | None) -> mx.array | None:
        """ids [T] at `positions` appended to `cache` -> float32 logits [T - logits_from, vocab]
        (None: the caller wants none; mlx-lm's head is then never evaluated).

        mlx-lm's forward ends in its head over every token of the call; where only the last
        tokens' logits are wanted (a prefill's last step) and no method attends, the step runs as
        two calls, the first without logits (what mlx-lm's own generate does)."""
        if logits_from is not None and logits_from < 0:  # counted from the end, as a slice start
            logits_from = max(0, ids.shape[0] + logits_from)
        if attend is None and logits_from is not None and 0 < logits_from < ids.shape[0]:
            head, rest = _split(positions, logits_from)
            self.step(ids[:logits_from], head, cache, None, None)
            return self.step(ids[logits_from:], rest, cache, None, 0)
        return self._forward(ids, positions, cache, attend, logits_from)

    def _forward(self, ids: mx.array, positions, cache, attend, logits_from: int | None) -> mx.array | None:
        """One call of mlx-lm's forward: `step` without the split (logits_from counted from the start)."""
        layers, hybrid = self.lm.layers, isinstance(cache, HybridKVCache)
        if hybrid:  # its recurrent state before this step, to go back to
            cache.begin_step(self, ids, positions)
            cache.replay = _replay
        caches = self._cache_list(cache)
        self.state.positions, self.state.attend, self.state.keys_at = positions, attend, {}
        try:
            if self.n_layers is not None:  # run the first n layers: a shorter list, other caches unused
                self._backbone["layers"] = layers[: self.n_layers]
            logits = self.lm(ids[None], cache=caches)
            if hybrid:
                cache.end_step()
        finally:
            self.state.positions = self.state.attend = None
            if self.n_layers is not None:
                self._backbone["layers"] = layers
        return None if logits_from is None else logits[0, logits_from:].astype(mx.float32)

    def _cache_list(self, cache: Sequence[Any] | None) -> list[Any]:
        """`cache` (one entry per layer of this model) as mlx-lm's cache list: the stateful layers' entries
        (a first-layers view's: None past its layers)."""
        total = len(self.lm_layouts)
        caches = list(cache) if cache is not None else [None] * total
        caches += [None] * (total - len(caches))
        return caches if len(self.stateful) == total else [caches[i] for i in self.stateful]


def _split(positions: int | np.ndarray, at: int) -> tuple[int | np.ndarray, int | np.ndarray]:
    """A step's positions (the first of consecutive ones, or one per token) split before token `at`."""
    if isinstance(positions, (int, np.integer)):
        return positions, positions + at
    return positions[:at], positions[at:]


def _replay(model: AdaptedModel, ids: mx.array, positions: int | np.ndarray, cache: HybridKVCache) -> None:
    """A hybrid cache's replay: the tokens again through `model` (no logits), evaluated."""
    model.step(ids, positions, cache, None, None)
    mx.eval(cache.state)


class AdaptedOps(MLXOps):
    """MLXOps for AdaptedModel: the step goes through mlx-lm's forward, and a method the model's
    layers cannot honour is refused by name before anything runs. A specfill model (a speculator
    loaded from a GGUF of an own family, speeding an adapted main model) runs as MLXOps runs it."""

    def activation_dtype(self, model: AdaptedModel | Any) -> mx.Dtype:
        return model.dtype if isinstance(model, AdaptedModel) else super().activation_dtype(model)

    def forward(self, model: AdaptedModel | Any, ids, positions, cache, attend, logits_from) -> mx.array | None:
        if not isinstance(model, AdaptedModel):
            return super().forward(model, ids, positions, cache, attend, logits_from)
        model.args.check_attend(attend, specprefill_step=not isinstance(positions, (int, np.integer)))
        return model.step(ids, positions, cache, attend, logits_from)

    def new_cache(self, model: AdaptedModel | Any, capacity: int) -> ModelKVCache | HybridKVCache:
        """specfill's KV cache; for a hybrid, a HybridKVCache (the recurrent layers keep mlx-lm's own)."""
        if not isinstance(model, AdaptedModel) or not model.args.hybrid:
            return share_layers(super().new_cache(model, capacity), model)
        lm, layouts = model.lm, model.lm_layouts  # every layer's (a first-layers view's args hold fewer)
        entry = {layer: k for k, layer in enumerate(stateful_layers(layouts))}  # layer -> mlx-lm's cache list
        library = _library_caches(lm)
        per_layer = [
            _layer_cache(layout, library[entry[i]] if i in entry else None, capacity)
            for i, layout in enumerate(model.args.layers)
        ]
        return HybridKVCache(per_layer, lambda index: _library_caches(lm)[entry[index]])


def _layer_cache(layout: Any, library: Any, capacity: int) -> Any:
    """One layer's entry of a HybridKVCache: specfill's LayerKVCache where the layer attends, mlx-lm's
    own cache where it keeps a recurrent state (both in mlx-lm's CacheList for a parallel layer)."""
    if layout.stateless:
        return None
    if layout.recurrent:
        return library
    if layout.parallel:
        return type(library)(*(c if type(c).__name__ != "KVCache" else LayerKVCache(capacity) for c in library.caches))
    return LayerKVCache(capacity)


def share_layers(cache: ModelKVCache, model: Any) -> ModelKVCache:
    """`cache` with each KV-shared layer's entry (Gemma 4's has_kv False) made a SharedLayerKVCache
    of its source layer's: the methods read that layer's keys (SpecPrefill's scoring) from the very
    arrays the source layer caches."""
    layouts = getattr(getattr(model, "args", None), "layers", ())
    for index, layout in enumerate(layouts):
        if getattr(layout, "kv_source", None) is not None:
            cache.layers[index] = SharedLayerKVCache(cache.layers[layout.kv_source], layout.kv_source)
    return cache


def stateful_layers(layouts: Sequence[Any]) -> list[int]:
    """The layers that hold an entry of mlx-lm's cache list (all but Nemotron-H's MLP / MoE blocks
    and Gemma 4's KV-shared layers, which read an earlier layer's)."""
    return [i for i, layout in enumerate(layouts) if not layout.stateless and layout.kv_source is None]


def _library_caches(lm: nn.Module) -> list[Any]:
    """mlx-lm's own caches for the model, one per layer (none filled)."""
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(lm)


def _check_source(layouts: tuple, layout: Any) -> Any:
    """A KV-shared layer as described, or refused where its source layer's keys are not of its shape
    (or are not the source's own) or its query norm is one the shared path does not apply."""
    if layout.kv_source is None or layout.refusal is not None:
        return layout
    source = layouts[layout.kv_source]
    if source.kv_source is not None or (source.n_kv_heads, source.head_dim) != (layout.n_kv_heads, layout.head_dim):
        reason = f"its source layer {layout.kv_source} caches keys of another shape (or none of its own)"
    elif layout.qk_norm not in ("none", "head") or layout.output_gate or layout.fused_qkv:
        reason = "a KV-shared layer with a query norm or gate the adapter does not apply to it"
    else:
        return layout
    return replace(layout, kind="attention of an unknown layout", refusal=reason)


def _check_caches(lm: nn.Module, architecture: str, layouts: tuple) -> None:
    """specfill gives every attention layer one KV cache of its own and keeps a recurrent layer's
    mlx-lm ArraysCache (a hybrid's); a model whose mlx-lm caches are anything else (cache lists of
    latent attention's indexer, layers sharing a cache, a recurrent layer with keys) is refused
    here, with the first such layer named."""
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache
    from mlx_lm.models.cache import KVCache as LibraryKVCache

    caches, stateful = _library_caches(lm), stateful_layers(layouts)
    if len(caches) != len(stateful):
        raise ModelLoadError(
            f"{architecture} has {len(caches)} mlx-lm caches for {len(stateful)} layers with attention or "
            f"a recurrent state (layers share a cache): specfill's KV cache needs one per layer"
        )
    for index, cache, layout in ((i, c, layouts[i]) for i, c in zip(stateful, caches)):
        if layout.parallel:  # mlx-lm's CacheList: the mixer's ArraysCache and the attention's KVCache
            kinds = sorted(type(c).__name__ for c in getattr(cache, "caches", ()))
            fits = len(kinds) == 2 and any(isinstance(c, ArraysCache) for c in cache.caches) and "KVCache" in kinds
        elif layout.recurrent:
            fits = isinstance(cache, ArraysCache)
        else:
            fits = type(cache) in (LibraryKVCache, RotatingKVCache)
        if not fits:
            raise ModelLoadError(
                f"{architecture} layer {index} is {layout.kind} and keeps mlx-lm's {type(cache).__name__}: "
                f"specfill's cache cannot hold it (every method is refused, use mlx-lm itself)"
            )
    if all(layout.recurrent for layout in layouts):
        raise ModelLoadError(f"{architecture} has no attention layer: nothing for specfill to run, use mlx-lm itself")


def adapt(lm: nn.Module) -> AdaptedModel:
    """Take over the attention of every decoder layer of the mlx-lm model `lm` (in place; the
    original modules stay inside the adapted ones; a refused layer runs its own module on specfill's
    cache, whose `make_mask` gives it mlx-lm's masks). A hybrid's recurrent layers (no softmax
    attention, an mlx-lm ArraysCache) stay as they are; a layer whose cache specfill cannot hold:
    ModelLoadError, `lm` as it was."""
    config = _config(lm)
    backbone_types = getattr(getattr(lm, "model", None), "layer_types", None)
    if not config.get("layer_types") and isinstance(backbone_types, (list, tuple)):
        config["layer_types"] = list(backbone_types)  # a default the backbone fills in (gpt_oss's alternation)
    architecture = str(config.get("model_type"))
    sources = getattr(_backbone(lm), "previous_kvs", None)  # Gemma 4: the layer whose keys each layer reads
    if isinstance(sources, list):
        config["previous_kvs"] = [int(source) for source in sources]
    for layer in lm.layers:  # adapted before: put the original modules back first
        found = attention_of(layer)
        if found is not None and isinstance(found[1], AdaptedAttention):
            layer[found[0]] = found[1].inner
    layouts = tuple(describe_layer(config, index, layer) for index, layer in enumerate(lm.layers))
    layouts = tuple(_check_source(layouts, layout) for layout in layouts)
    _check_caches(lm, architecture, layouts)
    state = StepState()
    for index, (layer, layout) in enumerate(zip(lm.layers, layouts)):
        if not (layout.recurrent or layout.stateless):  # the others run as mlx-lm's (a recurrent one on its cache)
            name, module = attention_of(layer)
            layer[name] = AdaptedAttention(module, layout, index, state)
    return AdaptedModel(lm, _args(lm, layouts), state)
