"""Speculative prefill of the MLX model (seed 002; scoring and selection in specprefill.py).

1. The speculator runs the whole prompt (full attention) and keeps, per layer, the post-RoPE
   query of the last prompt token; it then decodes up to `lookahead` greedy tokens, feeding each
   one that is not a stop id and keeping its query too. Its KV cache holds the prompt keys.
2. The 1 + N' queries score the prompt positions; whole chunks are kept (specprefill.py).
3. The main model prefills only the kept tokens, into cache slots 0..K-1 at their ORIGINAL
   position ids; decoding continues at position P (the prompt length), slot K.
Mirrors backends/torch_cuda/speculative.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from specfill.core.config import SpecPrefillConfig
from specfill.core.models import ModelArgs
from specfill.core.runtime import ProgressCallback

from .cache import KVCache
from .generate import prefill
from .model import Model, causal_attention
from .specprefill import Selection, select_tokens, token_importance


@dataclass(frozen=True)
class Speculator:
    """The model that scores the prompt: `model`'s first `n_layers` blocks, its final norm and
    LM head (all blocks for a separately loaded speculator; the first K for "self:K")."""

    model: Model
    n_layers: int
    step_size: int

    @property
    def context(self) -> int:
        return self.model.args.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.model.args.head_dim

    @property
    def args(self) -> ModelArgs:
        return self.model.args


class QueryCapture:
    """`PrefillAttention` for the speculator: causal attention that also keeps, per layer, the
    post-RoPE query of the last token of every step ending at or after slot `first_slot`
    (the prompt's last token, then each fed look-ahead token)."""

    def __init__(self, n_layers: int, first_slot: int, scale: float):
        self.first_slot = first_slot
        self.scale = scale
        self.queries: list[list[mx.array]] = [[] for _ in range(n_layers)]

    def __call__(self, layer: int, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        if k.shape[2] >= self.first_slot:  # k holds every slot up to this step's end
            self.queries[layer].append(mx.contiguous(q[0, :, -1]))  # a copy: no view of the step's q
        return causal_attention(q, k, v, self.scale)

    def arrays(self) -> list[mx.array]:
        return [q for per_layer in self.queries for q in per_layer]

    def stacked(self) -> mx.array:
        """[n_layers, n_queries, Hq, D]."""
        return mx.stack([mx.stack(per_layer) for per_layer in self.queries])


@dataclass
class SpeculatorPass:
    """queries [n_l, 1 + N', Hq, D] (last prompt token, then the fed look-ahead tokens);
    keys [n_l, Hkv, P, D] of every prompt position; lookahead the fed look-ahead tokens."""

    queries: mx.array
    keys: mx.array
    lookahead: list[int]


def run_speculator(speculator: Speculator, ids: mx.array, *, lookahead: int,
                   stop_ids: frozenset[int], progress: ProgressCallback | None = None) -> SpeculatorPass:
    """Full prefill of ids [P] on the speculator, then greedy look-ahead (see the module doc).

    The look-ahead stops early at a stop id (which is not fed) and at the speculator's context.
    """
    n_prompt, n_layers, model = ids.shape[0], speculator.n_layers, speculator.model
    lookahead = max(0, min(lookahead, speculator.context - n_prompt))
    cache = [KVCache(n_prompt + lookahead) for _ in range(n_layers)]
    capture = QueryCapture(n_layers, n_prompt, speculator.head_dim**-0.5)
    logits = prefill(model, ids, cache, step_size=speculator.step_size, attend=capture,
                     n_layers=n_layers, progress=progress)
    fed: list[int] = []
    for step in range(lookahead):
        token = int(mx.argmax(logits, axis=-1).item())
        if token in stop_ids:
            break
        fed.append(token)
        hidden = model.hidden(mx.array([[token]], dtype=mx.int32), n_prompt + step, cache, capture,
                              n_layers)
        if step + 1 < lookahead:  # the last fed token only contributes its query
            logits = model.logits(hidden[:, -1]).astype(mx.float32)
        mx.eval(logits, capture.arrays(), [c.state for c in cache])
    keys = mx.stack([c.keys[0, :, :n_prompt] for c in cache])
    queries = capture.stacked()
    mx.eval(queries, keys)
    return SpeculatorPass(queries, keys, fed)


@dataclass
class SparsePrefill:
    """What the main model's sparse prefill leaves for decoding: the last kept token's logits
    [1, vocab] (float32), the cache (kept tokens in slots 0..K-1), the position of the first
    decoded token (the prompt length P), the selection and the wall time of each part."""

    logits: mx.array
    cache: list[KVCache]
    next_position: int
    selection: Selection
    lookahead: list[int]
    seconds: dict[str, float] = field(default_factory=dict)


def speculative_prefill(model: Model, ids: mx.array, speculator: Speculator,
                        config: SpecPrefillConfig, *, stop_ids: frozenset[int], extra_slots: int,
                        step_size: int, use_kernels: bool | None = None,
                        progress: ProgressCallback | None = None) -> SparsePrefill:
    """Speculate, select, then prefill the kept tokens of ids [P] on `model`, in a cache with room
    for `extra_slots` decoded tokens after them. `progress` follows the speculator's pass over
    the whole prompt (the main model's prefill of the kept tokens is the short part)."""
    started = time.perf_counter()
    spec = run_speculator(speculator, ids, lookahead=config.lookahead, stop_ids=stop_ids,
                          progress=progress)
    speculated = time.perf_counter()
    importance = token_importance(spec.queries, spec.keys, config, speculator.head_dim**-0.5,
                                  use_kernels)
    selection = select_tokens(importance, config)
    mx.eval(selection.kept)
    selected = time.perf_counter()
    n_kept = selection.kept.shape[0]
    cache = [KVCache(n_kept + extra_slots) for _ in range(model.args.num_hidden_layers)]
    logits = prefill(model, ids[selection.kept], cache, positions=selection.position_ids,
                     step_size=step_size)
    finished = time.perf_counter()
    seconds = {"speculator": speculated - started, "selection": selected - speculated,
               "main_prefill": finished - selected}
    return SparsePrefill(logits, cache, selection.decode_start, selection, spec.lookahead, seconds)
