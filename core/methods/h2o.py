"""H2O two-phase chunked sparse prefill (seed 001), written once over `H2OOps`.

For query i in chunk C_c the keys are K(i) = {j in C_c : j <= i} U M_{c-1}. Per layer and logical
batch: phase 1 computes the intra part of every chunk at once (state and column sums); phase 2
walks the chunks in order: attend to the previous memory set, add its column sums to the scores,
build the next memory set; the two softmaxes of all the batch's chunks are then merged exactly at
once (rowwise: one merge per batch, not one per chunk; scripts/count_h2o_ops.py counts the ops).
`H2OPrefillAttention` plugs the walk into a model's prefill (one carry per layer);
`h2o_attention_layer` does one layer's whole prompt.
With a dense tail (H2OConfig.dense_tail = W > 0) the last W prompt queries are then recomputed as
causal attention over every key (`dense_tail_attention`), after the walk, which is left unchanged:
their sparse attention still votes in the scores, so scores and memory sets do not depend on W.
On a sliding layer of window w (core/models.py: query p sees keys q with p - w < q <= p) every
key set above is intersected with the window: phase 1, phase 2's memory set and the dense tail
all mask by position, and the scores only count what each query attended.
A layer's attention terms (core/stages.AttentionTerms: a logit soft-cap, per-head sinks) go to
every stage that computes logits; the stages cap the logits and put the sink into the softmaxes
whose weights they hand out (the column sums: each of the two softmaxes that vote, intra-only and
inter-only, is the one the layer computes over that key set, sink included), but their states
(m, l, o) stay sink-free. The sink is added ONCE, here, to each query's state over its whole key
set (`finish`): after phase 1 and phase 2 are merged, after the dense tail's prefix is merged. The
two phases cover disjoint key sets and merge as partial sums of one softmax; a sink folded into
either would be counted again by the merge (twice for a query with both), and states with the
sink inside would no longer merge exactly. Without terms the walk is exactly what it was.
The conformance oracle (core/reference/oracle.py) checks this walk against naive attention over
the explicit key sets, so it is checked against something it does not share.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Generic, Sequence

import numpy as np

from ..config import H2OConfig
from ..ops import H2OOps, ModelOps, checkpoint
from ..stages import (
    A,
    AttentionState,
    AttentionTerms,
    H2OCarry,
    H2OLayerResult,
    KeyWindow,
    active_terms,
    sinks_of,
    window_binds,
)


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


def dense_tail_start(config: H2OConfig, n_tokens: int) -> int:
    """First prompt position of the dense tail: n_tokens - W (n_tokens when W = 0, 0 when W >= N)."""
    return max(0, n_tokens - config.dense_tail)


def _with(terms: AttentionTerms[A] | None) -> tuple:
    """The stages' trailing terms argument: none at all without terms (today's calls, unchanged)."""
    return () if terms is None else (terms,)


def finish(ops: H2OOps[A], state: AttentionState[A], terms: AttentionTerms[A] | None) -> AttentionState[A]:
    """A query's state over its whole key set, its sink (if any) folded in once (the module doc)."""
    sinks = sinks_of(terms)
    return state if sinks is None else ops.add_sinks(state, sinks)


def concat_states(ops: H2OOps[A], states: Sequence[AttentionState[A]]) -> AttentionState[A]:
    """The states of consecutive query rows as one state (three concats; one state is itself)."""
    if len(states) == 1:
        return states[0]
    return AttentionState(
        ops.concat([s.m for s in states], axis=1),
        ops.concat([s.l for s in states], axis=1),
        ops.concat([s.o for s in states], axis=1),
    )


def dense_tail_attention(
    ops: H2OOps[A],
    q: A,
    k: A,
    v: A,
    start: int,
    tail_start: int,
    block: int,
    scale: float,
    window: int | None = None,
    terms: AttentionTerms[A] | None = None,
    origin: int = 0,
) -> A | None:
    """Causal attention over EVERY earlier key for the rows of q at positions >= tail_start.

    q [Hq, T, D] holds positions [start, start + T); k/v [Hkv, >= start + T, D] every key so far.
    Rows go in blocks on the grid of `block` (S) from `origin` (0; a reused prefix's length P: the
    new part's grid), the first from `tail_start` to the next grid line: a block [a, b) is its own
    causal part (the intra stage with one chunk) merged exactly with all keys [0, a) (the inter
    stage with the prefix as its "memory"), so the stages the walk uses (and their kernels) do the
    work and the biggest score tile is S x N. Steps start on
    chunk boundaries, so the blocks, and the rounding, do not depend on how the prompt is stepped. With a
    window w only the prefix keys [a - w + 1, a) can be seen, and each
    row masks its own. Returns o [Hq, rows, D] (statistics' dtype) or None when no row is in the tail.
    """
    terms = active_terms(terms)
    end = start + q.shape[1]
    first = max(start, tail_start)
    if first >= end:
        return None
    outputs = []
    line = lambda x: origin + ((x - origin) // block + 1) * block  # noqa: E731 - the grid line after x
    for a in [first] + list(range(line(first), end, block)):
        b = min(line(a), end)
        rows = q[:, a - start : b - start]
        state = ops.intra_attention(
            rows, k[:, a:b], v[:, a:b], b - a, scale, window if window_binds(window, b - a - 1) else None, *_with(terms)
        ).state
        lo = 0 if window is None else max(0, a - window + 1)
        if a > lo:
            key_window = KeyWindow(window, a, None, lo) if window_binds(window, b - 1 - lo) else None
            state = ops.merge_states(
                ops.inter_attention(rows, k[:, lo:a], v[:, lo:a], scale, key_window, *_with(terms)).state, state
            )
        outputs.append(finish(ops, state, terms).o)
    return outputs[0] if len(outputs) == 1 else ops.concat(outputs, axis=1)


def h2o_attention_batch(
    ops: H2OOps[A],
    q: A,
    k: A,
    v: A,
    carry: H2OCarry[A],
    config: H2OConfig,
    scale: float,
    is_last: bool,
    tail_start: int | None = None,
    window: int | None = None,
    terms: AttentionTerms[A] | None = None,
    origin: int = 0,
) -> tuple[A, H2OCarry[A]]:
    """One logical batch of one layer: phase 1 for all its chunks, then the phase-2 walk.

    q [Hq, T, D] are the batch's queries, positions [carry.n_done, carry.n_done + T);
    k/v [Hkv, >= carry.n_done + T, D] hold every key so far (memory sets point back into them).
    is_last: the batch ends the prompt, so no memory set is built after its final chunk.
    tail_start: the dense tail's first position (dense_tail_start); None or >= the batch's end:
    no row of this batch is in it. window: the layer's sliding window (None: global); it is passed
    to a stage only where it can hide a key (so the kernels keep running elsewhere). terms: the
    layer's attention terms (None: none; the sink is folded in once per query, see the module doc).
    origin: where the chunk grid starts (0; from a reused prefix of P tokens, P: the carry then
    starts with scores [Hkv, P] and the prefix as its memory set, `prefix_carry`). Returns the
    batch's output [Hq, T, D] (q's dtype) and the carry for the next batch.
    """
    size, terms = config.chunk_size, active_terms(terms)
    start, n_tokens = carry.n_done, q.shape[1]
    n_kv = k.shape[0]
    if (start - origin) % size != 0 or start < origin:
        raise ValueError(f"a logical batch must start on a chunk boundary, got position {start} (grid from {origin})")
    if k.shape[1] < start + n_tokens or tuple(v.shape[:2]) != tuple(k.shape[:2]):
        raise ValueError(f"k/v {tuple(k.shape)} must hold the {start + n_tokens} keys up to this batch's end")
    with ops.stage_scope(q):
        intra = ops.intra_attention(
            q,
            k[:, start : start + n_tokens],
            v[:, start : start + n_tokens],
            size,
            scale,
            window if window_binds(window, min(size, n_tokens) - 1) else None,
            *_with(terms),
        )
        # every chunk's scores start from its own phase-1 column sums; phase 2 adds to them
        scores = ops.concat([carry.scores, ops.reduce_colsum_to_kv_heads(intra.colsum, n_kv)], axis=1)
        memory, memory_sets = carry.memory, list(carry.memory_sets)
        # phase 2's states, from the batch's first chunk with a memory set (every chunk but the
        # prompt's first) to its end; merged with phase 1's once the walk is done (the merge is
        # rowwise and no later chunk reads it: one merge per batch, not one per chunk)
        inter_states: list[AttentionState[A]] = []
        inter_start = n_tokens
        for local_start in range(0, n_tokens, size):
            checkpoint()  # a cancelled request (core/ops.py) stops before the next chunk
            local_end = min(local_start + size, n_tokens)
            chunk_start, chunk_end = start + local_start, start + local_end
            if memory is not None:
                k_mem, v_mem = ops.gather_memory(k, v, memory)
                key_window = (
                    KeyWindow(window, chunk_start, memory.indices) if window_binds(window, chunk_end - 1) else None
                )  # memory positions are >= 0
                inter = ops.inter_attention(q[:, local_start:local_end], k_mem, v_mem, scale, key_window, *_with(terms))
                scores = ops.accumulate_scores(scores, memory, ops.reduce_colsum_to_kv_heads(inter.colsum, n_kv))
                inter_start = min(inter_start, local_start)
                inter_states.append(inter.state)
            if is_last and local_end == n_tokens:
                break  # no memory set after the final chunk: nothing would read it
            if local_end - local_start != size:
                raise ValueError("only the final chunk of a prompt may be partial")
            memory = ops.build_memory_set(
                scores, memory, (chunk_start - origin) // size, chunk_start, chunk_end, config.local, config.heavy
            )
            memory_sets.append(memory)
        outputs = [] if inter_start == 0 else [finish(ops, intra.state.rows(0, inter_start), terms).o]
        if inter_states:
            merged = ops.merge_states(concat_states(ops, inter_states), intra.state.rows(inter_start, n_tokens))
            outputs.append(finish(ops, merged, terms).o)
        tail = (
            None
            if tail_start is None
            else dense_tail_attention(ops, q, k, v, start, tail_start, size, scale, window, terms, origin)
        )
        if tail is not None:  # the walk's rows of the tail are replaced (one concat), its scores kept
            keep, pieces = tail_start - start, []
            for piece in outputs:
                if keep > 0:
                    pieces.append(piece if piece.shape[1] <= keep else piece[:, :keep])
                keep -= piece.shape[1]
            outputs = pieces + [tail]
        out = outputs[0] if len(outputs) == 1 else ops.concat(outputs, axis=1)
    return ops.cast_like(out, q), H2OCarry(scores=scores, memory=memory, memory_sets=memory_sets)


def prefix_carry(ops: H2OOps[A], n_kv: int, prefix: int, like: A) -> H2OCarry[A]:
    """The carry a walk from a reused prefix of `prefix` tokens starts with (docs/methods.md, H2O
    from a reused prefix): zero scores [Hkv, P] (the prefix is not recomputed: no phase-1 sums)
    and the whole prefix as the first memory set M_{-1} (every KV head; not listed in memory_sets)."""
    scores = ops.zero_scores(n_kv, prefix, like)
    if prefix == 0:
        return H2OCarry(scores=scores)
    # the memory-set op with the prefix as one chunk whose "local window" is all of it: [0, P) per head
    return H2OCarry(scores=scores, memory=ops.build_memory_set(scores, None, -1, 0, prefix, prefix, 0))


def h2o_attention_layer(
    ops: H2OOps[A],
    q: A,
    k: A,
    v: A,
    config: H2OConfig,
    scale: float,
    window: int | None = None,
    terms: AttentionTerms[A] | None = None,
    prefix: int = 0,
) -> H2OLayerResult[A]:
    """Whole-prompt H2O attention of one layer: q [Hq, N, D], k [Hkv, N, D], v [Hkv, N, Dv] after RoPE
    (Dv = D but for latent attention); the output is [Hq, N, Dv].

    Logical batch by logical batch (config.batch_size), carrying scores and memory sets. With H2O
    disabled (L + H = 0) it is plain causal attention with zero scores, as in the llama.cpp plan
    (inside the layer's sliding window, when it has one; with the layer's terms, when it has any).
    prefix: P > 0 walks a new part after a reused prefix (docs/methods.md, H2O from a reused
    prefix): q [Hq, N - P, D] holds the new part's queries (positions P..N-1), k/v every key; the
    output is the new part's [Hq, N - P, Dv], the scores [Hkv, N] and the memory sets the new chunks'.
    """
    ranks = (len(q.shape), len(k.shape), len(v.shape))
    if ranks != (3, 3, 3) or tuple(k.shape[:2]) != tuple(v.shape[:2]) or q.shape[1] + prefix != k.shape[1]:
        raise ValueError(
            f"h2o attention takes q [Hq, N - P, D], k [Hkv, N, D] and v [Hkv, N, Dv] (P = {prefix}); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    n_tokens, n_kv, terms = k.shape[1], k.shape[0], active_terms(terms)
    n_new = n_tokens - prefix
    config = config.for_prompt(n_tokens)  # a memory_share becomes L and H for this prompt
    if n_new == 0:
        return H2OLayerResult(q, ops.zero_scores(n_kv, n_tokens, q), [])
    if prefix > 0 and not config.enabled:  # plain causal attention over every key: one chunk
        one = replace(config, chunk_size=n_new, batch_size=n_new, local=0, heavy=0, dense_tail=0)
        carry = prefix_carry(ops, n_kv, prefix, q)
        output, _ = h2o_attention_batch(ops, q, k, v, carry, one, scale, True, None, window, terms, prefix)
        return H2OLayerResult(output, ops.zero_scores(n_kv, n_tokens, q), [])
    if not config.enabled:
        if window_binds(window, n_tokens - 1) or terms is not None:
            binding = window if window_binds(window, n_tokens - 1) else None
            state = ops.intra_attention(q, k, v, n_tokens, scale, binding, *_with(terms)).state
            output = ops.cast_like(finish(ops, state, terms).o, q)
        else:
            output = ops.causal_attention(q, k, v, scale)
        return H2OLayerResult(output, ops.zero_scores(n_kv, n_tokens, q), [])
    carry = prefix_carry(ops, n_kv, prefix, q)
    outputs = []
    for batch_start in range(prefix, n_tokens, config.batch_size):
        batch_end = min(batch_start + config.batch_size, n_tokens)
        out, carry = h2o_attention_batch(
            ops,
            q[:, batch_start - prefix : batch_end - prefix],
            k,
            v,
            carry,
            config,
            scale,
            is_last=batch_end == n_tokens,
            tail_start=dense_tail_start(config, n_tokens),
            window=window,
            terms=terms,
            origin=prefix,
        )
        outputs.append(out)
    output = outputs[0] if len(outputs) == 1 else ops.concat(outputs, axis=1)
    return H2OLayerResult(output, carry.scores, carry.memory_sets)


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

    def __call__(self, layer: int, q: A, k: A, v: A) -> A:
        if layer not in self.sparse:  # a layer outside config.layers attends to every key
            return self.ops.causal_step(q, k, v, self.scale, self.windows[layer], *_with(self.terms[layer]))
        end = k.shape[2]
        start = end - q.shape[2]
        carry = self.carries[layer] or prefix_carry(self.ops, k.shape[1], self.origin, q)
        if carry.n_done != start:
            raise ValueError(f"layer {layer}: H2O batch starts at slot {start}, the carry is at {carry.n_done}")
        # memory sets point back into earlier batches: the walk gets every key stored so far
        out, self.carries[layer] = h2o_attention_batch(
            self.ops,
            q[0],
            k[0],
            v[0],
            carry,
            self.config,
            self.scale,
            is_last=end == self.n_tokens,
            tail_start=dense_tail_start(self.config, self.n_tokens),
            window=self.windows[layer],
            terms=self.terms[layer],
            origin=self.origin,
        )
        return out[None]

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
