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

import inspect
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch import nn

from specfill.core.adapted import AdaptedArgs, AttentionLayout
from specfill.core.errors import ModelLoadError

from .adapted_probe import (
    STEPWISE_MIXERS,
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
from .hybrid_cache import HybridKVCache


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
        kinds: tuple[list[str], list[int]] | None = None,
        stepwise: tuple[nn.Module, ...] = (),
    ):
        self.lm = lm
        self.stepwise = stepwise  # mixers run token by token over a continued multi-token step (stepwise_mixers)
        self.kinds = kinds  # a hybrid's (check_layer_kinds): every layer's kind and linear-attention states
        self.args = args
        self.index = index
        self.layer_list = layer_list
        self.n_layers = n_layers
        self.configs = model_configs(lm)  # switched to specfill's attention during each step
        self.cache_keyword = cache_keyword(lm)
        self.embed_tokens = lm.get_input_embeddings()  # TorchOps reads the activation dtype and device from it

    def first_layers(self, n_layers: int) -> AdaptedModel:
        total = self.args.num_hidden_layers if self.n_layers is None else self.n_layers
        if not 1 <= n_layers <= total:
            raise ValueError(f"first_layers takes 1..{total} layers, got {n_layers}")
        return AdaptedModel(
            self.lm, self.args.first(n_layers), self.index, self.layer_list, n_layers, self.kinds, self.stepwise
        )

    def new_cache(self, capacity: int) -> ModelKVCache | HybridKVCache:
        """specfill's KV cache; for a hybrid, a HybridKVCache (the recurrent layers keep transformers' own state)."""
        dtype, device = self.embed_tokens.weight.dtype, self.embed_tokens.weight.device
        if self.kinds is None:
            return ModelKVCache.allocate(self.args, capacity, dtype, device)
        return HybridKVCache.allocate(*self.kinds, self.args, capacity, dtype, device)

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelKVCache | HybridKVCache,
        logits_from: int | None = 0,
        attend: Any = None,
    ) -> torch.Tensor | None:
        """The contract of model.Transformer.forward (TorchOps runs either model): ids [1, T] at RoPE
        `positions` [T] appended to `cache`; `attend` replaces causal attention. Returns float32
        logits [1, T - logits_from, vocab], or None for logits_from None (transformers' head then
        runs on one token only)."""
        # SpecPrefill's main pass (kept tokens at their original positions) runs on every layer: a refused
        # layer attends by its family's own eager function with a mask from the cached positions
        # (adapter._own_attention); what else the layers cannot honour is refused before anything runs
        self.args.check_attend(attend)
        steps = ids.shape[1]
        keep = 1 if logits_from is None else steps - (logits_from % steps if logits_from < 0 else logits_from)
        parent, name = self.layer_list
        layers = getattr(parent, name)
        if self.n_layers is not None:
            setattr(parent, name, nn.ModuleList(list(layers)[: self.n_layers]))
        hybrid = cache if isinstance(cache, HybridKVCache) else None
        if hybrid is not None:  # its recurrent state before this step, to go back to
            hybrid.begin_step(self, ids[0], positions)
            hybrid.replay = _replay
        token = ACTIVE.set(StepState(self.index, self.args.layers, positions, cache, attend))
        try:
            with implementation(self.configs, NAME), stepwise_mixers(self.stepwise if hybrid is not None else ()):
                out = self.lm(
                    input_ids=ids,
                    position_ids=positions[None],
                    use_cache=hybrid is not None,
                    logits_to_keep=keep if keep < steps else 0,
                    **({self.cache_keyword: hybrid.library} if hybrid is not None else {}),
                )
            if hybrid is not None:
                hybrid.end_step()
        finally:
            ACTIVE.reset(token)
            setattr(parent, name, layers)
        return None if logits_from is None else out.logits.float()


@contextmanager
def stepwise_mixers(mixers: tuple[nn.Module, ...]) -> Iterator[None]:
    """While inside, each mixer in `mixers` (adapted_probe.STEPWISE_MIXERS: one that starts any step of
    several tokens from a zero SSM state) runs such a step token by token when its cache already holds
    a state: its single-token path reads and updates the state, so the step continues it exactly. A
    step from an empty state (a prompt's first) keeps the mixer's whole-sequence path."""
    for mixer in mixers:
        mixer.forward = _stepwise(mixer, mixer.forward)
    try:
        yield
    finally:
        for mixer in mixers:
            del mixer.forward  # the class's own forward again


def cache_keyword(lm: nn.Module) -> str:
    """The keyword `lm`'s forward takes its Cache by: `cache` in transformers >= 5.20 (where
    `past_key_values` is deprecated), `past_key_values` before (5.17 on the GPU image, whose forward
    would take `cache` into **kwargs and run without any: a hybrid's second step from a zero state)."""
    return "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"


def _has_state(cache: Any, layer: int) -> bool:
    """Whether `cache` (transformers' Cache) holds a recurrent state for `layer`, in either API:
    `get_recurrent_state` (transformers >= 5.20) or `has_previous_state` (before)."""
    if hasattr(cache, "get_recurrent_state"):
        return cache.get_recurrent_state(layer) is not None
    return bool(cache.has_previous_state(layer))


def _stepwise(mixer: nn.Module, forward: Any) -> Any:
    signature = inspect.signature(forward)
    # the cache's parameter: `cache` (transformers >= 5.20) or `cache_params` (before)
    cache_name = "cache" if "cache" in signature.parameters else "cache_params"

    def run(*args: Any, **kwargs: Any) -> Any:
        call = signature.bind(*args, **kwargs)
        hidden_states = call.arguments["hidden_states"]
        cache, mask = call.arguments.get(cache_name), call.arguments.get("attention_mask")
        steps = hidden_states.shape[1]
        if cache is None or steps == 1 or not _has_state(cache, mixer.layer_idx):
            return forward(*args, **kwargs)
        outs = []
        for t in range(steps):
            call.arguments["hidden_states"] = hidden_states[:, t : t + 1]
            if mask is not None:
                call.arguments["attention_mask"] = mask[:, t : t + 1]
            outs.append(forward(*call.args, **call.kwargs))
        return torch.cat(outs, dim=1)

    return run


def _replay(model: AdaptedModel, ids: torch.Tensor, positions: int | Any, cache: HybridKVCache) -> None:
    """A hybrid cache's replay: the tokens [T] again through `model` at `positions` (no logits)."""
    device = ids.device
    if isinstance(positions, int):
        positions = torch.arange(positions, positions + ids.shape[0], device=device)
    else:
        positions = torch.as_tensor(positions, dtype=torch.int64, device=device)
    model(ids[None], positions, cache, None)


def _layouts(
    calls: list, index: dict[int, int], kinds: list[str], refusal: Any, eps: float, layer_list: tuple[nn.Module, str]
) -> tuple:
    """One AttentionLayout per decoder layer: a call's for an attention layer (`parallel` beside a
    mixer), a recurrent or stateless one (the shapes of the first attention layer) for the others."""
    by_layer = {index[id(call[0])]: layout_of(call, refusal, eps) for call in calls}
    first = by_layer[min(by_layer)]
    layers = list(getattr(*layer_list))
    out = []
    for i, kind in enumerate(kinds):
        if kind == "attention":
            out.append(by_layer[i])
        elif kind == "parallel":
            out.append(replace(by_layer[i], parallel=True))
        else:
            names = ", ".join(sorted(_mixers(layers[i])))
            recurrent = kind in ("recurrent", "lightning")
            what = "a linear-attention / state-space layer" if recurrent else "a block without attention"
            out.append(
                AttentionLayout(
                    f"{what} ({names})",
                    first.n_heads,
                    first.n_kv_heads,
                    first.head_dim,
                    first.scale,
                    recurrent=recurrent,
                    stateless=kind == "stateless",
                )
            )
    return tuple(out)


_NOT_MIXERS = ("Norm", "MLP", "MoE", "Moe", "MoeBlock", "Experts", "Dropout", "Identity", "ModuleList")


def _mixers(layer: nn.Module) -> set[str]:
    """The class names of a decoder layer's token mixers (its children but norms, MLPs, experts);
    a block without a mixer: its children but norms."""
    names = {type(c).__name__ for c in layer.children()}
    mixers = {n for n in names if not n.endswith(_NOT_MIXERS)}
    return mixers or {n for n in names if not n.endswith("Norm")} or names


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
    it as an AdaptedModel (`lm` itself is not modified; a hybrid's recurrent layers run as
    transformers' own, on its linear-attention cache inside hybrid_cache.HybridKVCache). A model
    whose attention does not go through transformers' AttentionInterface, a layer kind specfill's
    cache cannot hold (check_layer_kinds), keys and values the KV cache cannot hold, or (check) a
    model the 6-token self-check finds computing otherwise than transformers: ModelLoadError naming it."""
    register()
    text = lm.config.get_text_config()
    architecture = str(text.model_type)
    kinds = check_layer_kinds(text, architecture)
    hybrid = kinds is not None and any(kind != "attention" for kind in kinds[0])
    lm.eval()
    calls = probe(lm, architecture)
    index, layer_list = layer_index(lm, calls, architecture, kinds[0] if hybrid else None)
    if any(call[4].get("is_causal") is False for call in calls):
        raise ModelLoadError(
            f"{architecture} has bidirectional attention layers (is_causal=False): specfill's "
            f"masks are causal; {USE_TRANSFORMERS}"
        )
    check_cacheable(architecture, calls)
    refusal = config_refusal(text)
    eps = float(getattr(text, "rms_norm_eps", None) or 1e-6)
    if hybrid:
        layouts = _layouts(calls, index, kinds[0], refusal, eps, layer_list)
    else:
        layouts = tuple(layout_of(call, refusal, eps) for call in sorted(calls, key=lambda c: index[id(c[0])]))
    names = STEPWISE_MIXERS.get(architecture, ())
    stepwise = tuple(m for m in lm.modules() if type(m).__name__ in names) if hybrid else ()
    model = AdaptedModel(
        lm, _args(text, layouts), index, layer_list, kinds=kinds if hybrid else None, stepwise=stepwise
    )
    if check and hybrid:
        try:
            self_check(model, model.new_cache)
        except (ValueError, TypeError, RuntimeError, AttributeError) as err:  # not transformers' Cache API
            first = next(i for i, kind in enumerate(kinds[0]) if kind != "attention")
            raise ModelLoadError(
                f"{architecture} layer {first} is a linear-attention / state-space layer whose forward "
                f"does not run on transformers' Cache ({type(err).__name__}: {str(err).splitlines()[0][:120]}): "
                f"specfill's hybrid cache holds transformers' own cache layers; {USE_TRANSFORMERS}"
            ) from None
    elif check:
        self_check(model, model.new_cache)
    return model
