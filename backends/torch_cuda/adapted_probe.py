"""What the transformers adapter learns and checks when it takes a model over (adapted.adapt).

- `check_layer_kinds`: transformers' own per-layer cache kinds (`get_layer_types_and_kwargs`, the
  list its DynamicCache is built from): softmax attention (global or sliding), and a hybrid's
  linear-attention / state-space layers, mixers beside attention and MLP blocks (hybrid_cache.py
  holds their state); chunked attention and layers sharing another's keys are refused by name.
- `probe`: one forward of 2 tokens with a recording attention: which module calls transformers'
  AttentionInterface, from which decoder layer, with which shapes and arguments.
- `self_check`: 6 tokens through the adapter in two steps against transformers' own forward:
  anything the adapter does not model that shows on consecutive positions is refused at load
  instead of running silently wrong.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from specfill.core.errors import ModelLoadError

from .adapter import ACTIVE, NAME, Probe

# transformers' cache kinds -> (the layer kind a refusal names, why); softmax-attention kinds pass
ATTENTION_KINDS = ("full_attention", "sliding_attention")
# a hybrid's other kinds -> how specfill's hybrid cache holds the layer (hybrid_cache.py): transformers'
# own linear-attention state ("recurrent"), beside specfill's keys ("parallel"), nothing ("stateless")
HYBRID_KINDS = {
    "conv": "recurrent",
    "linear_attention": "recurrent",
    "hybrid": "parallel",
    "hybrid_sliding": "parallel",
}
# hybrids whose mixer (class name) starts every step of several tokens from a zero SSM state (transformers'
# Jamba: its mamba_selective_scan takes no initial state; its conv and single-token paths read the cache):
# a step of several tokens after the first runs that mixer token by token (adapted.stepwise_mixers)
STEPWISE_MIXERS = {"jamba": ("JambaMambaMixer",)}
# hybrids whose linear-attention layers keep their state in the model's own cache class, not in
# transformers' LinearAttentionLayer -> specfill's kind for them (hybrid_cache.HybridKVCache holds it):
# MiniMax-Text-01's lightning attention, its K^T V state in MiniMaxCache.linear_cache
OWN_STATE_KINDS = {"minimax": "lightning"}
REFUSED_KINDS = {
    "chunked_attention": (
        "chunked attention",
        "each query sees only its own chunk's keys, a mask specfill does not build",
    ),
    "dummy": (
        "a layer without a KV cache of its own",
        "it shares another layer's keys and values; specfill's KV cache holds one attention per layer",
    ),
    "indexed_attention": ("indexed sparse attention", "an indexer picks the keys each query sees"),
}
# config settings that change which keys a query sees without any argument of the interface call
MASK_SETTINGS = {"use_bidirectional_attention": "bidirectional attention"}
SELF_CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 5e-2}  # x max(1, max|logit|)
USE_TRANSFORMERS = "every method is refused, use transformers itself"


def model_configs(lm: nn.Module) -> list[Any]:
    """The distinct config objects `lm`'s modules hold (the model's, its text model's, ...)."""
    from transformers import PreTrainedConfig

    found = {id(c): c for m in lm.modules() for c in [vars(m).get("config")] if isinstance(c, PreTrainedConfig)}
    return list(found.values())


@contextmanager
def implementation(configs: list[Any], name: str) -> Iterator[None]:
    """Every config in `configs` (model_configs) names `name` as attention implementation while
    inside (the attention modules read `self.config._attn_implementation` at each call)."""
    saved = [config._attn_implementation_internal for config in configs]
    for config in configs:
        config._attn_implementation_internal = name
    try:
        yield
    finally:
        for config, value in zip(configs, saved):
            config._attn_implementation_internal = value


# a hybrid's blocks without attention or state: transformers' "dummy" (5.20 on); before (5.17 on the GPU
# image) it lists a hybrid's MLP and MoE blocks by their own names
STATELESS_KINDS = ("dummy", "mlp", "moe")


def check_layer_kinds(text: Any, architecture: str) -> tuple[list[str], list[int]]:
    """Every layer's kind for specfill ("attention", "recurrent", "lightning" (OWN_STATE_KINDS),
    "parallel" or "stateless": a
    hybrid's MLP / MoE block, transformers' "dummy" without KV sharing) and its number of
    linear-attention states; ModelLoadError naming the first layer whose transformers cache kind
    specfill cannot hold or whose config makes its mask one specfill does not build."""
    for setting, kind in MASK_SETTINGS.items():
        if getattr(text, setting, None):
            raise ModelLoadError(
                f"{architecture} layer 0 is {kind} ({setting}): specfill's masks are causal; {USE_TRANSFORMERS}"
            )
    from transformers.cache_utils import get_layer_types_and_kwargs

    try:
        kinds, kwargs = get_layer_types_and_kwargs(text)
    except (ValueError, TypeError, AttributeError) as err:  # configs transformers' own cache cannot describe
        raise ModelLoadError(
            f"{architecture}: transformers cannot list its layers' cache kinds "
            f"({str(err).splitlines()[0][:120]}); {USE_TRANSFORMERS}"
        ) from None
    hybrid = any(kind in HYBRID_KINDS for kind in kinds)
    sharing = getattr(text, "kv_sharing_modes", None) is not None
    ours = []
    for index, kind in enumerate(kinds):
        if kind in ATTENTION_KINDS:
            ours.append("attention")
        elif kind == "linear_attention" and architecture in OWN_STATE_KINDS:
            ours.append(OWN_STATE_KINDS[architecture])
        elif kind in HYBRID_KINDS:
            ours.append(HYBRID_KINDS[kind])
        elif kind in STATELESS_KINDS and hybrid and not sharing:
            ours.append("stateless")
        else:
            name, why = REFUSED_KINDS.get(kind, (f"a {kind} layer", "specfill runs softmax-attention layers only"))
            raise ModelLoadError(
                f"{architecture} layer {index} is {name} (transformers' cache kind {kind!r}): {why}; {USE_TRANSFORMERS}"
            )
    if hybrid and not any(kind in ("attention", "parallel") for kind in ours):
        raise ModelLoadError(f"{architecture} has no attention layer: nothing for specfill to run; {USE_TRANSFORMERS}")
    if isinstance(kwargs, dict):  # transformers before ~5.20 (5.17 on the GPU image): one dict for every layer
        kwargs = [kwargs] * len(kinds)
    return ours, [int(k.get("number_of_states", 1)) for k in kwargs]


def probe(lm: nn.Module, architecture: str) -> list[tuple[nn.Module, tuple, tuple, tuple, dict[str, Any]]]:
    """One forward of 2 tokens with the recording attention: every interface call, in order, as
    (module, q shape, k shape, v shape, arguments)."""
    recorder = Probe()
    token = ACTIVE.set(recorder)
    device = next(lm.parameters()).device
    try:
        with torch.inference_mode(), implementation(model_configs(lm), NAME):
            lm(
                input_ids=torch.zeros(1, 2, dtype=torch.int64, device=device),
                position_ids=torch.arange(2, device=device)[None],
                use_cache=False,
                logits_to_keep=1,
            )
    except Exception as err:  # any failure of the library's forward under the recording attention
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ModelLoadError(
            f"{architecture}: transformers' forward fails with specfill's attention "
            f"({type(err).__name__}: {first}); {USE_TRANSFORMERS}"
        ) from None
    finally:
        ACTIVE.reset(token)
    if not recorder.calls:
        raise ModelLoadError(
            f"{architecture} ({type(lm).__name__}) does not run its attention through "
            f"transformers' AttentionInterface: specfill cannot take it over; {USE_TRANSFORMERS}"
        )
    return recorder.calls


def _contains(layer: nn.Module, module: nn.Module) -> bool:
    return any(m is module for m in layer.modules())


def layer_index(
    lm: nn.Module, calls: list, architecture: str, kinds: list[str] | None = None
) -> tuple[dict[int, int], tuple[nn.Module, str]]:
    """(id(attention module) -> decoder layer, (parent, attribute) of the decoder-layer ModuleList).
    Every attention layer (`kinds`, check_layer_kinds'; None: every layer) must call the interface
    exactly once, from its own attention module; a hybrid's other layers call it never."""
    first = calls[0][0]
    found = next(
        (
            (parent, name)
            for parent in lm.modules()
            for name, child in parent.named_children()
            if isinstance(child, nn.ModuleList) and any(_contains(layer, first) for layer in child)
        ),
        None,
    )
    if found is None:
        raise ModelLoadError(f"{architecture}: no module list of decoder layers holds {type(first).__name__}")
    layers = list(getattr(*found))
    index: dict[int, int] = {}
    for module, *_ in calls:
        owner = next((i for i, layer in enumerate(layers) if _contains(layer, module)), None)
        if owner is None or id(module) in index or owner in index.values():
            raise ModelLoadError(
                f"{architecture}: {type(module).__name__} is called outside the decoder layers or "
                f"more than once per layer; specfill's KV cache holds one attention per layer"
            )
        index[id(module)] = owner
    for i, layer in enumerate(layers):
        if i not in index.values() and (kinds is None or kinds[i] in ("attention", "parallel")):
            names = ", ".join(sorted({type(c).__name__ for c in layer.children()}))
            raise ModelLoadError(
                f"{architecture} layer {i} ({names}) does not call transformers' AttentionInterface "
                f"though its cache kind is attention: specfill cannot take it over; {USE_TRANSFORMERS}"
            )
    return index, found


def config_refusal(text: Any) -> tuple[str, str] | None:
    """(layer kind, reason) for config settings that make every layer's attention one the sparse
    methods cannot run (dynamic RoPE: full prefill and decoding stay transformers' own), else None."""
    rope = getattr(text, "rope_parameters", None) or {}
    parameters = [rope] + [v for v in rope.values() if isinstance(v, dict)] if isinstance(rope, dict) else []
    if any(p.get("rope_type") == "dynamic" for p in parameters):
        return "dynamic RoPE", "its frequencies depend on the longest position of each step, not on each position"
    return None


def self_check(model: Any, new_cache: Any) -> None:
    """6 tokens (ids 3..8 within the vocabulary) through the adapted `model` in two steps of 3 into
    `new_cache(6)` against transformers' own forward in one call, with its eager attention (the
    reference: transformers 5.17's default SDPA path for Gemma 2 drops the logit soft-cap, which
    5.24 fixed by refusing SDPA there): ModelLoadError when they differ by more than
    SELF_CHECK_TOLERANCE of max(1, max|logit|) (something the adapter does not model: a state kept
    outside the KV cache, another mask, attention after the interface call)."""
    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    ids = torch.arange(3, 9, device=device)[None] % model.args.vocab_size
    with torch.inference_mode():
        with implementation(model.configs, "eager"):
            want = model.lm(input_ids=ids, use_cache=False).logits[0].float()
        cache = new_cache(6)
        model(ids[:, :3], torch.arange(3, device=device), cache, None)
        got = model(ids[:, 3:], torch.arange(3, 6, device=device), cache, 0)[0]
    err = float((got - want[3:]).abs().max())
    bound = SELF_CHECK_TOLERANCE.get(dtype, 5e-2) * max(1.0, float(want.abs().max()))
    if not err <= bound:
        raise ModelLoadError(
            f"{model.args.architecture}: specfill's attention does not reproduce transformers' "
            f"forward on a 6-token check (max |diff| {err:.3g} > {bound:.3g}): the model does "
            f"something the adapter does not model; {USE_TRANSFORMERS}"
        )
