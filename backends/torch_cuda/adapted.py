"""A transformers model run by specfill: its own forward, with every layer's attention going through
specfill's attention-interface function (adapter.py).

`adapt(lm)` probes the model once to describe each decoder layer's attention (core/adapted.py's
AttentionLayout) and returns an `AdaptedModel`: the object `CausalLM` holds, with `AdaptedArgs`
as its args. `AdaptedOps` is TorchOps with the model step going through transformers'
`ForCausalLM.forward` at explicit `position_ids`, its attention implementation switched to
specfill's for the step only: outside a specfill step the model still runs as transformers' own.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from specfill.core.adapted import AdaptedArgs, MethodRefusedError
from specfill.core.errors import ModelLoadError
from specfill.core.methods.h2o import H2OPrefillAttention
from specfill.core.methods.specprefill import QueryCapture

from .adapter import ACTIVE, NAME, Probe, StepState, check_cacheable, layout_of, register
from .kv_cache import ModelKVCache
from .ops import TorchOps

# config settings that change which keys a query sees without any interface argument saying so:
# refused at load (specfill's masks would differ from the model's for every method)
MASK_SETTINGS = {"attention_chunk_size": ("chunked attention", "each query sees only the keys of its own chunk"),
                    "use_bidirectional_attention": ("bidirectional attention", "queries see later keys")}


@contextmanager
def _implementation(lm: nn.Module, name: str) -> Iterator[None]:
    """Every config of `lm`'s modules names `name` as attention implementation while inside."""
    from transformers import PreTrainedConfig

    configs = {id(c): c for m in lm.modules() for c in [vars(m).get("config")] if isinstance(c, PreTrainedConfig)}
    saved = {key: config._attn_implementation_internal for key, config in configs.items()}
    for config in configs.values():
        config._attn_implementation_internal = name
    try:
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]


def _layer_list(lm: nn.Module, module: nn.Module) -> tuple[nn.Module, str]:
    """(parent, attribute name) of the nn.ModuleList of decoder layers holding attention `module`."""
    for parent in lm.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and any(m is module for layer in child for m in layer.modules()):
                return parent, name
    raise ModelLoadError(f"{type(lm).__name__}: no module list of decoder layers holds {type(module).__name__}")


def _config_refusal(text: Any) -> tuple[str, str] | None:
    """(layer kind, reason) for config settings that make every layer's attention one the sparse
    methods cannot run (dynamic RoPE: full prefill and decoding stay transformers' own), else None."""
    rope = getattr(text, "rope_parameters", None) or {}
    parameters = [rope] + [v for v in rope.values() if isinstance(v, dict)] if isinstance(rope, dict) else []
    if any(p.get("rope_type") == "dynamic" for p in parameters):
        return "dynamic RoPE", "its frequencies depend on the longest position of each step, not on each position"
    return None


class AdaptedModel:
    """A transformers model whose layers' attention specfill runs (see the module doc).

    lm: the transformers ForCausalLM; args: its AdaptedArgs; index: id(attention module) -> layer;
    n_layers: run only the first n decoder layers (then the final norm and head), the "self:K"
    speculator view; None: every layer."""

    def __init__(self, lm: nn.Module, args: AdaptedArgs, index: dict[int, int], layer_list: tuple[nn.Module, str],
                 n_layers: int | None = None):
        self.lm = lm
        self.args = args
        self.index = index
        self.layer_list = layer_list
        self.n_layers = n_layers
        self.dtype = next(p.dtype for p in lm.parameters() if p.is_floating_point())
        self.device = next(lm.parameters()).device

    def first_layers(self, n_layers: int) -> AdaptedModel:
        total = self.args.num_hidden_layers if self.n_layers is None else self.n_layers
        if not 1 <= n_layers <= total:
            raise ValueError(f"first_layers takes 1..{total} layers, got {n_layers}")
        return AdaptedModel(self.lm, self.args.first(n_layers), self.index, self.layer_list, n_layers)

    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache: ModelKVCache, attend: Any,
             logits_from: int | None) -> torch.Tensor | None:
        """ids [T] at RoPE `positions` [T] appended to `cache` -> float32 logits
        [T - logits_from, vocab] (None: the caller wants none; the head then runs on one token)."""
        steps = ids.shape[0]
        keep = 1 if logits_from is None else steps - (logits_from % steps if logits_from < 0 else logits_from)
        parent, name = self.layer_list
        layers = getattr(parent, name)
        if self.n_layers is not None:
            setattr(parent, name, nn.ModuleList(list(layers)[:self.n_layers]))
        token = ACTIVE.set(StepState(self.index, self.args.layers, positions, cache, attend))
        try:
            with _implementation(self.lm, NAME):
                out = self.lm(input_ids=ids[None], position_ids=positions[None], use_cache=False,
                              logits_to_keep=keep if keep < steps else 0)
        finally:
            ACTIVE.reset(token)
            setattr(parent, name, layers)
        return None if logits_from is None else out.logits[0].float()


class AdaptedOps(TorchOps):
    """TorchOps for AdaptedModel: the step goes through transformers' forward, and a method the
    model's layers cannot honour is refused by name before anything runs."""

    def activation_dtype(self, model: AdaptedModel) -> torch.dtype:
        return model.dtype

    def forward(self, model: AdaptedModel, ids: torch.Tensor, positions: int | np.ndarray, cache: ModelKVCache,
                attend: Any, logits_from: int | None) -> torch.Tensor | None:
        if isinstance(attend, H2OPrefillAttention):
            model.args.check_method("h2o")
        elif isinstance(attend, QueryCapture):
            model.args.check_method("speculator")
        elif not isinstance(positions, (int, np.integer)):
            model.args.check_method("specprefill")
        elif attend is not None:
            raise MethodRefusedError(f"{type(attend).__name__} is not a method the adapter knows")
        if isinstance(positions, (int, np.integer)):
            pos = torch.arange(int(positions), int(positions) + ids.shape[0], device=self.device)
        else:
            pos = torch.as_tensor(positions, dtype=torch.int64, device=self.device)
        return model.step(ids, pos, cache, attend, logits_from)

    def new_cache(self, model: AdaptedModel, capacity: int) -> ModelKVCache:
        return ModelKVCache.allocate(model.args, capacity, model.dtype, model.device)

    def first_layers(self, model: AdaptedModel, n_layers: int) -> AdaptedModel:
        return model.first_layers(n_layers)


def _probe(lm: nn.Module) -> list:
    """One forward of 2 tokens with the recording attention: every interface call, in order."""
    probe = Probe()
    token = ACTIVE.set(probe)
    device = next(lm.parameters()).device
    try:
        with torch.inference_mode(), _implementation(lm, NAME):
            lm(input_ids=torch.zeros(1, 2, dtype=torch.int64, device=device),
               position_ids=torch.arange(2, device=device)[None], use_cache=False, logits_to_keep=1)
    finally:
        ACTIVE.reset(token)
    return probe.calls


def _args(text: Any, layouts: tuple) -> AdaptedArgs:
    eos = getattr(text, "eos_token_id", None)
    rope = getattr(text, "rope_parameters", None)
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    return AdaptedArgs(architecture=str(text.model_type), vocab_size=int(text.vocab_size),
                       hidden_size=int(text.hidden_size), layers=layouts,
                       max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 4096),
                       rms_norm_eps=float(getattr(text, "rms_norm_eps", None) or 1e-5),
                       rope_theta=float(theta or 10000.0), bos_token_id=getattr(text, "bos_token_id", None),
                       eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)))


def adapt(lm: nn.Module) -> AdaptedModel:
    """Describe every decoder layer of the transformers CausalLM `lm` by one probe call and return
    it as an AdaptedModel (`lm` is not modified). A model whose attention does not go through
    transformers' AttentionInterface, a decoder layer without softmax attention (linear attention,
    state-space: hybrids) or keys and values the KV cache cannot hold: ModelLoadError naming it."""
    register()
    text = lm.config.get_text_config()
    architecture = str(text.model_type)
    for setting, (kind, why) in MASK_SETTINGS.items():
        if getattr(text, setting, None):
            raise ModelLoadError(f"{architecture} layer 0 is {kind} ({setting}={getattr(text, setting)!r}): {why}, "
                                 f"which specfill's masks do not model; every method is refused, use transformers itself")
    lm.eval()
    calls = _probe(lm)
    if not calls:
        raise ModelLoadError(f"{architecture} ({type(lm).__name__}) does not run its attention through "
                             f"transformers' AttentionInterface: specfill cannot take it over; use transformers itself")
    parent, name = _layer_list(lm, calls[0][0])
    layers = list(getattr(parent, name))
    index = {}
    for module, *_ in calls:
        owner = next((i for i, layer in enumerate(layers) if any(m is module for m in layer.modules())), None)
        if owner is None or id(module) in index or owner in index.values():
            raise ModelLoadError(f"{architecture}: {type(module).__name__} is called outside the decoder layers or "
                                 f"more than once per layer; specfill's KV cache holds one attention per layer")
        index[id(module)] = owner
    for i, layer in enumerate(layers):
        if i not in index.values():
            kinds = ", ".join(sorted({type(c).__name__ for c in layer.children()}))
            raise ModelLoadError(f"{architecture} layer {i} is a linear-attention / state-space layer ({kinds}): "
                                 f"specfill's KV cache holds softmax-attention layers only; every method is refused, "
                                 f"use transformers itself")
    if any(call[4].get("is_causal") is False for call in calls):
        raise ModelLoadError(f"{architecture} has bidirectional attention layers (is_causal=False): specfill's "
                             f"masks are causal; every method is refused, use transformers itself")
    check_cacheable(architecture, calls)
    refusal = _config_refusal(text)
    eps = float(getattr(text, "rms_norm_eps", None) or 1e-6)
    layouts = tuple(layout_of(call, refusal, eps) for call in sorted(calls, key=lambda c: index[id(c[0])]))
    return AdaptedModel(lm, _args(text, layouts), index, (parent, name))
