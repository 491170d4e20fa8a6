"""A transformers model run by specfill: its own forward, with every layer's attention going through
specfill's attention-interface function (adapter.py).

`adapt(lm)` checks and probes the model (adapted_probe.py) to describe each decoder layer's
attention (core/adapted.py's AttentionLayout) and returns an `AdaptedModel`: the object `CausalLM`
holds, with `AdaptedArgs` as its args. It keeps the call contract of specfill's own
model.Transformer, so the backend's one TorchOps runs either (an own main model with an adapted
speculator or draft, and the reverse): its step is transformers' `ForCausalLM.forward` at explicit
`position_ids`, the attention implementation switched to specfill's for the step only; outside a
specfill step the model still runs as transformers' own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specfill.core.adapted import AdaptedArgs, MethodRefusedError
from specfill.core.errors import ModelLoadError
from specfill.core.methods.h2o import H2OPrefillAttention
from specfill.core.methods.specprefill import QueryCapture

from .adapted_probe import (
    USE_TRANSFORMERS,
    check_layer_kinds,
    config_refusal,
    implementation,
    layer_index,
    model_configs,
    probe,
    self_check,
)
from .adapter import ACTIVE, NAME, StepState, check_cacheable, layout_of, register
from .cache import ModelKVCache


class AdaptedModel:
    """A transformers model whose layers' attention specfill runs (see the module doc).

    lm: the transformers ForCausalLM; args: its AdaptedArgs; index: id(attention module) -> layer;
    n_layers: run only the first n decoder layers (then the final norm and head), the "self:K"
    speculator view; None: every layer."""

    def __init__(
        self,
        lm: nn.Module,
        args: AdaptedArgs,
        index: dict[int, int],
        layer_list: tuple[nn.Module, str],
        n_layers: int | None = None,
    ):
        self.lm = lm
        self.args = args
        self.index = index
        self.layer_list = layer_list
        self.n_layers = n_layers
        self.configs = model_configs(lm)  # switched to specfill's attention during each step
        self.embed_tokens = lm.get_input_embeddings()  # TorchOps reads the activation dtype and device from it

    def first_layers(self, n_layers: int) -> AdaptedModel:
        total = self.args.num_hidden_layers if self.n_layers is None else self.n_layers
        if not 1 <= n_layers <= total:
            raise ValueError(f"first_layers takes 1..{total} layers, got {n_layers}")
        return AdaptedModel(self.lm, self.args.first(n_layers), self.index, self.layer_list, n_layers)

    def _check(self, attend: Any) -> None:
        """Refuse by name a method the model's layers cannot honour, before anything runs: H2O or
        the speculator's query capture. SpecPrefill's main pass (kept tokens at their original
        positions) runs on every layer: a refused layer attends by its family's own eager function
        with a mask from the cached positions (adapter._own_attention)."""
        if isinstance(attend, H2OPrefillAttention):
            self.args.check_method("h2o")
        elif isinstance(attend, QueryCapture):
            self.args.check_method("speculator")
            if attend.prompt_attend is not None:  # SpecPrefill over an H2O speculator: its prompt pass runs H2O
                self.args.check_method("h2o")
        elif attend is not None:
            raise MethodRefusedError(f"{type(attend).__name__} is not a method the adapter knows")

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelKVCache,
        logits_from: int | None = 0,
        attend: Any = None,
    ) -> torch.Tensor | None:
        """The contract of model.Transformer.forward (TorchOps runs either model): ids [1, T] at RoPE
        `positions` [T] appended to `cache`; `attend` replaces causal attention. Returns float32
        logits [1, T - logits_from, vocab], or None for logits_from None (transformers' head then
        runs on one token only)."""
        self._check(attend)
        steps = ids.shape[1]
        keep = 1 if logits_from is None else steps - (logits_from % steps if logits_from < 0 else logits_from)
        parent, name = self.layer_list
        layers = getattr(parent, name)
        if self.n_layers is not None:
            setattr(parent, name, nn.ModuleList(list(layers)[: self.n_layers]))
        token = ACTIVE.set(StepState(self.index, self.args.layers, positions, cache, attend))
        try:
            with implementation(self.configs, NAME):
                out = self.lm(
                    input_ids=ids,
                    position_ids=positions[None],
                    use_cache=False,
                    logits_to_keep=keep if keep < steps else 0,
                )
        finally:
            ACTIVE.reset(token)
            setattr(parent, name, layers)
        return None if logits_from is None else out.logits.float()


def _args(text: Any, layouts: tuple) -> AdaptedArgs:
    eos = getattr(text, "eos_token_id", None)
    rope = getattr(text, "rope_parameters", None)
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    return AdaptedArgs(
        architecture=str(text.model_type),
        vocab_size=int(text.vocab_size),
        hidden_size=int(text.hidden_size),
        layers=layouts,
        max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 4096),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", None) or 1e-5),
        rope_theta=float(theta or 10000.0),
        bos_token_id=getattr(text, "bos_token_id", None),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)),
    )


def adapt(lm: nn.Module, check: bool = True) -> AdaptedModel:
    """Describe every decoder layer of the transformers CausalLM `lm` (adapted_probe.py) and return
    it as an AdaptedModel (`lm` itself is not modified). A model whose attention does not go
    through transformers' AttentionInterface, a layer without softmax attention (linear attention,
    state-space, hybrids), keys and values the KV cache cannot hold, or (check) a model the
    6-token self-check finds computing otherwise than transformers: ModelLoadError naming it."""
    register()
    text = lm.config.get_text_config()
    architecture = str(text.model_type)
    check_layer_kinds(text, architecture)
    lm.eval()
    calls = probe(lm, architecture)
    index, layer_list = layer_index(lm, calls, architecture)
    if any(call[4].get("is_causal") is False for call in calls):
        raise ModelLoadError(
            f"{architecture} has bidirectional attention layers (is_causal=False): specfill's "
            f"masks are causal; {USE_TRANSFORMERS}"
        )
    check_cacheable(architecture, calls)
    refusal = config_refusal(text)
    eps = float(getattr(text, "rms_norm_eps", None) or 1e-6)
    layouts = tuple(layout_of(call, refusal, eps) for call in sorted(calls, key=lambda c: index[id(c[0])]))
    model = AdaptedModel(lm, _args(text, layouts), index, layer_list)
    if check:
        self_check(
            model,
            lambda capacity: ModelKVCache.allocate(
                model.args, capacity, model.embed_tokens.weight.dtype, model.embed_tokens.weight.device
            ),
        )
    return model
