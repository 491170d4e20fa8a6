"""The H2O walk (seed 001), written once over `H2OOps`: one layer's two-phase chunked sparse
prefill attention from the stages, shared by the methods (core/methods/h2o.py's
`H2OPrefillAttention` plugs it into a model's prefill) and the NumPy reference (its
`attention_layer` runs it over the reference stages). Neither imports the other.

For query i in chunk C_c the keys are K(i) = {j in C_c : j <= i} U M_{c-1}. Per layer and logical
batch: phase 1 computes the intra part of every chunk at once (state and column sums); phase 2
walks the chunks in order: attend to the previous memory set, add its column sums to the scores,
build the next memory set; the two softmaxes of all the batch's chunks are then merged exactly at
once (rowwise: one merge per batch, not one per chunk; scripts/count_h2o_ops.py counts the ops).
`h2o_attention_batch` advances one batch; `h2o_attention_layer` does one layer's whole prompt.
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
from typing import Sequence

from .config import H2OConfig
from .ops import H2OOps, checkpoint
from .stages import (
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


def dense_tail_start(config: H2OConfig, n_tokens: int) -> int:
    """First prompt position of the dense tail: n_tokens - W (n_tokens when W = 0, 0 when W >= N)."""
    return max(0, n_tokens - config.dense_tail)


def terms_arg(terms: AttentionTerms[A] | None) -> tuple:
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
            rows,
            k[:, a:b],
            v[:, a:b],
            b - a,
            scale,
            window if window_binds(window, b - a - 1) else None,
            *terms_arg(terms),
            with_colsum=False,
        ).state
        lo = 0 if window is None else max(0, a - window + 1)
        if a > lo:
            key_window = KeyWindow(window, a, None, lo) if window_binds(window, b - 1 - lo) else None
            state = ops.merge_states(
                ops.inter_attention(
                    rows, k[:, lo:a], v[:, lo:a], scale, key_window, *terms_arg(terms), with_colsum=False
                ).state,
                state,
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
            *terms_arg(terms),
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
                inter = ops.inter_attention(
                    q[:, local_start:local_end], k_mem, v_mem, scale, key_window, *terms_arg(terms)
                )
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
            state = ops.intra_attention(q, k, v, n_tokens, scale, binding, *terms_arg(terms), with_colsum=False).state
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
