"""H2O two-phase chunked sparse prefill (seed 001) in a model's prefill, written once over `ModelOps`.

The walk itself (the stages strung together over one layer's prompt, dense tail, sliding windows,
attention terms, a reused prefix) is core/h2o_walk.py, shared with the NumPy reference.
`H2OPrefillAttention` plugs it into a model's prefill (one carry per layer); `uses_full_attention`
and `h2o_step_size` decide whether and how a prompt runs it; the dot-product counts are its cost.
"""

from __future__ import annotations

from typing import Any, Generic, Sequence

import numpy as np

from ..config import H2OConfig
from ..h2o_walk import dense_tail_start, h2o_attention_batch, prefix_carry, terms_arg
from ..ops import ModelOps
from ..stages import A, AttentionTerms, H2OCarry, MemorySet, active_terms, attention_layers, layer_terms


def uses_full_attention(config: H2OConfig, n_tokens: int) -> bool:
    """H2O is plain causal attention for a prompt of one chunk or with no memory (L + H = 0)."""
    return not config.for_prompt(n_tokens).enabled or n_tokens <= config.chunk_size


def h2o_step_size(config: H2OConfig, step_size: int) -> int:
    """Tokens per H2O prefill step: the whole chunks that fit in `step_size` (the model's prefill
    step), at least one chunk and at most a logical batch (B). A step runs phase 1 for its chunks
    and phase 2 chunk by chunk; the carry holds what the next step needs, so the output does not
    depend on the step (B and the step size only schedule work) and each step is a point where
    progress is reported and a cancelled request stops."""
    size = config.chunk_size
    return min(config.batch_size, max(size, step_size // size * size))


def h2o_prefill(
    ops: ModelOps[A], config: H2OConfig, args: Any, n_tokens: int, step_size: int, origin: int = 0
) -> tuple[H2OPrefillAttention[A] | None, int]:
    """(the attention, the step size) of an H2O prefill of an n_tokens prompt through a model of shape
    `args` (ModelArgs) whose first `origin` tokens are cached (a reused prefix): (None, step_size)
    where the new part reads every key either way (one chunk or less: the prefix is its M_-1; or no
    memory), else H2OPrefillAttention stepping by whole chunks (h2o_step_size)."""
    if uses_full_attention(config.for_prompt(n_tokens), n_tokens - origin):
        return None, step_size
    attend = H2OPrefillAttention(
        ops,
        config,
        args.num_hidden_layers,
        args.attention_scale,
        n_tokens,
        args.layer_windows,
        layer_terms(args),
        attention_layers(args),
        origin=origin,
    )
    return attend, h2o_step_size(config, step_size)


class H2OPrefillAttention(Generic[A]):
    """The `PrefillAttention` of H2O prefill over a prompt of `n_tokens`: one carry per layer,
    advanced by each logical batch (one prefill step per batch); layers outside config.layers
    attend causally to every key instead (no carry, no memory sets). windows: each
    layer's sliding window (ModelArgs.layer_window; empty: every layer global); terms: each layer's
    attention terms (layer_terms; empty: none); attention: the layers with keys (a hybrid's; empty:
    all), over which config.layers counts (its recurrent layers never call this). origin: the reused
    prefix's length P (0: none): its P slots are in the cache already and the walk runs over slots
    P..n_tokens-1 from the prefix as its first memory set (prefix_carry; docs/methods.md)."""

    def __init__(
        self,
        ops: ModelOps[A],
        config: H2OConfig,
        n_layers: int,
        scale: float,
        n_tokens: int,
        windows: Sequence[int | None] = (),
        terms: Sequence[AttentionTerms[A] | None] = (),
        attention: Sequence[int] = (),
        origin: int = 0,
    ):
        self.ops = ops
        self.origin = origin  # a reused prefix's length: the walk starts there (prefix_carry)
        self.windows = list(windows) or [None] * n_layers
        self.terms = [active_terms(t) for t in terms] or [None] * n_layers
        self.config = config.for_prompt(n_tokens)  # a memory_share becomes L and H for this prompt
        attention = list(attention) or list(range(n_layers))  # a hybrid's: config.layers counts these
        self.sparse = frozenset(attention[i] for i in config.layer_indices(len(attention)))
        self.scale = scale
        self.n_tokens = n_tokens
        self.carries: list[H2OCarry[A] | None] = [None] * n_layers
        self.replay = ops.walk_replay()  # this prompt's batches, run or replayed (ModelOps.walk_replay)

    def __call__(self, layer: int, q: A, k: A, v: A) -> A:
        if layer not in self.sparse:  # a layer outside config.layers attends to every key
            return self.ops.causal_step(q, k, v, self.scale, self.windows[layer], *terms_arg(self.terms[layer]))
        end = k.shape[2]
        start = end - q.shape[2]
        carry = self.carries[layer] or prefix_carry(self.ops, k.shape[1], self.origin, q)
        if carry.n_done != start:
            raise ValueError(f"layer {layer}: H2O batch starts at slot {start}, the carry is at {carry.n_done}")
        window, terms, previous = self.windows[layer], self.terms[layer], carry.memory
        sinks = None if terms is None else terms.sinks

        def run(arrays: list[A]) -> tuple[list[A], list[int]]:
            """The batch over its arrays alone (q, k, v, scores[, memory set][, sinks]): what a replay records."""
            memory = None if previous is None else MemorySet(arrays[4], previous.chunk_index)
            own = None if terms is None else AttentionTerms(None if sinks is None else arrays[-1], terms.softcap)
            out, after = h2o_attention_batch(
                self.ops,
                arrays[0],
                arrays[1],
                arrays[2],
                H2OCarry(scores=arrays[3], memory=memory),
                self.config,
                self.scale,
                is_last=end == self.n_tokens,
                tail_start=dense_tail_start(self.config, self.n_tokens),
                window=window,
                terms=own,
                origin=self.origin,
            )
            built = after.memory_sets
            return [out, after.scores] + [m.indices for m in built], [m.chunk_index for m in built]

        # memory sets point back into earlier batches: the walk gets every key stored so far. Every layer's
        # batch from `start` to `end` is the same operators on other arrays where the layer's window and
        # terms (a soft-cap's value, whether it has sinks) are the same: the key
        inputs = [q[0], k[0], v[0], carry.scores] + ([] if previous is None else [previous.indices])
        inputs += [] if sinks is None else [sinks]
        kind = (window, None if terms is None else terms.softcap, sinks is not None)
        outputs, built = self.replay(((start, end), kind), run, inputs)
        new = [MemorySet(indices, chunk) for indices, chunk in zip(outputs[2:], built)]
        self.carries[layer] = H2OCarry(
            scores=outputs[1], memory=new[-1] if new else previous, memory_sets=carry.memory_sets + new
        )
        return outputs[0][None]

    def last_row_dense(self, layer: int) -> bool:
        """Whether `layer` is one of its H2O layers whose last prompt row attends to every key (the
        dense tail, W >= 1): there a causal step over that row gives the walk's output."""
        return layer in self.sparse and self.config.dense_tail > 0

    def queries_from(self, layer: int, steps: int, end: int) -> int:
        """Every query of an H2O layer (each adds to the scores that pick later memory sets); none
        of a causal one."""
        return 0 if layer in self.sparse else steps

    def arrays(self) -> list[Any]:
        """The carries' scores and memory sets (evaluating an evaluated array costs nothing)."""
        carries = [c for c in self.carries if c is not None]
        return [c.scores for c in carries] + [m.indices for c in carries for m in c.memory_sets]

    def memory_sets(self, to_numpy: Any) -> list[list[np.ndarray]]:
        """Per layer, M_0 .. M_{k-2} as int64 NumPy arrays [Hkv, L + H]."""
        return [
            [np.asarray(to_numpy(m.indices)).astype(np.int64) for m in (c.memory_sets if c else [])]
            for c in self.carries
        ]


def h2o_dot_products(n_tokens: int, chunk_size: int, memory_size: int, dense_tail: int = 0) -> int:
    """q.k products per head of H2O prefill: causal intra per chunk + one memory per later chunk
    (+ the dense tail's rows over every earlier key; its walk rows are counted too, as computed)."""
    first = max(0, n_tokens - dense_tail)
    total = sum(i + 1 for i in range(first, n_tokens))
    for chunk_start in range(0, n_tokens, chunk_size):
        length = min(chunk_size, n_tokens - chunk_start)
        total += length * (length + 1) // 2
        if chunk_start > 0:
            total += length * memory_size
    return total


def full_dot_products(n_tokens: int) -> int:
    """q.k products per head of full causal prefill."""
    return n_tokens * (n_tokens + 1) // 2
