"""Speculative prefill of the torch model (seed 002; scoring and selection in specprefill.py).

1. The speculator runs the whole prompt (full attention) and keeps, per layer, the post-RoPE
   query of the last prompt token; it then decodes up to `lookahead` greedy tokens, feeding each
   one that is not a stop id and keeping its query too. Its KV cache holds the prompt keys.
2. The 1 + N' queries score the prompt positions; whole chunks are kept (specprefill.py).
3. The main model prefills only the kept tokens, into cache slots 0..K-1 at their ORIGINAL
   position ids; decoding continues at position P (the prompt length), slot K.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfill.core.config import SpecPrefillConfig
from specfill.core.runtime import ProgressCallback

from .attention import causal_attention
from .generate import prefill, wall_time
from .kv_cache import KVCache, LayerKVCache
from .model import Transformer
from .specprefill import TokenSelection, speculative_selection


class QueryCapture:
    """`PrefillAttention` for the speculator: causal attention that also keeps, per layer, the
    post-RoPE query of the last token of every step ending at or after slot `first_slot`
    (the prompt's last token, then each fed look-ahead token)."""

    def __init__(self, n_layers: int, first_slot: int):
        self.first_slot = first_slot
        self.queries: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cache: LayerKVCache, start: int) -> torch.Tensor:
        if start + q.shape[2] >= self.first_slot:
            self.queries[layer].append(q[0, :, -1].clone())  # a copy: the step's q is large
        return causal_attention(layer, q, k, v, cache, start)

    def stacked(self) -> torch.Tensor:
        """[n_layers, n_queries, Hq, D]."""
        return torch.stack([torch.stack(per_layer) for per_layer in self.queries])


@dataclass
class SpeculatorPass:
    """queries [n_l, 1 + N', Hq, D] (last prompt token, then the fed look-ahead tokens);
    keys [n_l, Hkv, P, D] of every prompt position; lookahead the fed look-ahead tokens."""

    queries: torch.Tensor
    keys: torch.Tensor
    lookahead: list[int]


@torch.inference_mode()
def run_speculator(speculator: Transformer, ids: torch.Tensor, *, lookahead: int, stop_ids: frozenset[int],
                   step_size: int, progress: ProgressCallback | None = None) -> SpeculatorPass:
    """Full prefill of ids [P] on the speculator, then greedy look-ahead (see the module doc).

    The look-ahead stops early at a stop id (which is not fed) and at the speculator's context.
    """
    n_prompt = ids.shape[0]
    args = speculator.args
    lookahead = max(0, min(lookahead, args.max_position_embeddings - n_prompt))
    weight = speculator.embed.weight
    cache = KVCache.allocate(args, n_prompt + lookahead, weight.dtype, weight.device)
    capture = QueryCapture(args.num_hidden_layers, n_prompt)
    logits = prefill(speculator, ids, torch.arange(n_prompt, device=ids.device), cache,
                     step_size=step_size, attend=capture, progress=progress)[-1]
    fed: list[int] = []
    for step in range(lookahead):
        token = int(logits.argmax())
        if token in stop_ids:
            break
        fed.append(token)
        position = torch.tensor([n_prompt + step], device=ids.device)
        wants_logits = step + 1 < lookahead  # the last fed token only contributes its query
        out = speculator(torch.tensor([[token]], device=ids.device), position, cache, cache.filled,
                         0 if wants_logits else None, capture)
        logits = out[0, -1] if out is not None else logits
    return SpeculatorPass(capture.stacked(), cache.all_keys(n_prompt), fed)


@dataclass
class SparsePrefill:
    """What the main model's sparse prefill leaves for decoding: the last kept token's logits
    [vocab] (float32), the cache (kept tokens in slots 0..K-1), the position of the first decoded
    token (the prompt length P), the selection and the wall time of each part."""

    logits: torch.Tensor
    cache: KVCache
    next_position: int
    selection: TokenSelection
    lookahead: list[int]
    seconds: dict[str, float] = field(default_factory=dict)


@torch.inference_mode()
def speculative_prefill(model: Transformer, ids: torch.Tensor, speculator: Transformer,
                        config: SpecPrefillConfig, *, stop_ids: frozenset[int], extra_slots: int,
                        step_size: int, speculator_step_size: int, use_kernels: bool | None = None,
                        progress: ProgressCallback | None = None) -> SparsePrefill:
    """Speculate, select, then prefill the kept tokens of ids [P] on `model`, in a cache with room
    for `extra_slots` decoded tokens after them. `progress` follows the speculator's pass over
    the whole prompt (the main model's prefill of the kept tokens is the short part)."""
    device = ids.device
    spec_device = speculator.embed.weight.device
    started = wall_time(device)
    spec = run_speculator(speculator, ids.to(spec_device), lookahead=config.lookahead, stop_ids=stop_ids,
                          step_size=speculator_step_size, progress=progress)
    speculated = wall_time(spec_device)
    _, selection = speculative_selection(spec.queries, spec.keys, config, speculator.args.head_dim ** -0.5,
                                         use_kernels)
    kept = selection.kept.to(device)
    selected = wall_time(spec_device)
    cache = KVCache.allocate(model.args, kept.shape[0] + extra_slots, model.embed.weight.dtype, device)
    logits = prefill(model, ids[kept], kept, cache, step_size=step_size)[-1]
    finished = wall_time(device)
    seconds = {"speculator": speculated - started, "selection": selected - speculated,
               "main_prefill": finished - selected}
    return SparsePrefill(logits, cache, selection.decode_start, selection, spec.lookahead, seconds)
