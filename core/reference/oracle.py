"""The oracle: H2O attention over the explicit key sets of seed 001, Appendix B.

    K(i) = {j in C_c : j <= i} U M_{c-1}       for query i in chunk C_c, i < N - W
    K(i) = {j : j <= i}                        for query i >= N - W (the dense tail, W >= 0)
    K(i) intersected with {j : j > i - w}      on a sliding layer of window w (every query)

From a reused prefix of P tokens (docs/methods.md, H2O from a reused prefix; `prefix=P`): the
queries are the new part's, i in [P, N); chunks C_c = [P + cS, ...) and M_{-1} = [0, P), the whole
prefix, with zero scores (no phase-1 sums for the prefix: it is not recomputed).

A layer's terms enter every softmax here as the model itself writes them (transformers'
eager_attention_forward): the soft-cap as cap * tanh(scale * q.k / cap) before the mask, a sink
as one more column of logits that is softmaxed with the keys and then dropped (gpt_oss). Both the
outputs and the scores' softmaxes take them: the sink is in every denominator.

The dense tail changes outputs only: scores still add every query's walk attention (intra-only
softmax, then the inter softmax over M_{c-1}), as the walk computes them, and the memory sets
follow from the scores.

Deliberately naive and independent of the two-phase reference: one query at a time, a full
[N]-wide mask per query, softmax over K(i) in one piece, memory sets built with Python sets
and a (-score, position) sort. Slow; for small cases and tests only.
"""

from __future__ import annotations

import math

import numpy as np


def _softmax(x: np.ndarray, sink: float | None = None) -> np.ndarray:
    """Softmax of logits x [K] (with a sink: of [x, sink], the sink's column dropped)."""
    if sink is not None:
        return _softmax(np.append(x, sink))[:-1]
    e = np.exp(x - x.max())
    return e / e.sum()


def _capped(logits: np.ndarray, softcap: float | None) -> np.ndarray:
    return logits if softcap is None else softcap * np.tanh(logits / softcap)


def oracle_h2o_layer(
    q, k, v, chunk_size, local, heavy, scale, dense_tail=0, window=None, sinks=None, softcap=None, prefix=0
) -> tuple[np.ndarray, list[list[list[int]]], np.ndarray]:
    """Returns (output [Hq, N, Dv], memory sets [chunk][kv head] -> sorted positions, scores [Hkv, N])
    of q [Hq, N, D], k [Hkv, N, D], v [Hkv, N, Dv] (read in float64) under H2O's chunk_size, local
    and heavy (H2OConfig's) and a dense tail of `dense_tail` rows. A sliding window w keeps, of
    every key set, the keys j > i - w only; the scores count only what each query attended.
    sinks [Hq] / softcap: the layer's terms (see the module doc).
    prefix P: q [Hq, N - P, D] holds the queries of positions P..N-1 only, k / v all N keys; the
    output is theirs [Hq, N - P, Dv] (scores stay [Hkv, N])."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    q = np.concatenate([np.zeros((q.shape[0], prefix, q.shape[2])), q], axis=1)  # row i is position i
    sink = (lambda h: None) if sinks is None else (lambda h: float(sinks[h]))  # noqa: E731
    logit = lambda g, keys, h, i: _capped(k[g, keys] @ q[h, i] * scale, softcap)  # noqa: E731
    n_heads, n_tokens, _ = q.shape
    n_kv = k.shape[0]
    group = n_heads // n_kv
    n_chunks = math.ceil((n_tokens - prefix) / chunk_size)
    chunk_start = lambda i: prefix + (i - prefix) // chunk_size * chunk_size  # noqa: E731
    seen = lambda i, keys: [j for j in keys if window is None or j > i - window]  # noqa: E731
    scores = np.zeros((n_kv, n_tokens))

    # initial scores: column sums of each chunk's own causal softmax
    for h in range(n_heads):
        g = h // group
        for i in range(prefix, n_tokens):
            keys = seen(i, range(chunk_start(i), i + 1))
            scores[g, keys] += _softmax(logit(g, keys, h, i), sink(h))

    out = np.zeros((n_heads, n_tokens, v.shape[-1]))  # values may be narrower than keys (latent attention)
    memory: list[list[int]] | None = [list(range(prefix))] * n_kv if prefix else None
    memory_sets: list[list[list[int]]] = []
    for c in range(n_chunks):
        start, end = prefix + c * chunk_size, min(prefix + (c + 1) * chunk_size, n_tokens)
        for h in range(n_heads):
            g = h // group
            for i in range(start, end):
                key_set = set(range(start, i + 1)) | (set(memory[g]) if memory else set())
                if i >= n_tokens - dense_tail:
                    key_set = set(range(0, i + 1))
                mask = np.zeros(n_tokens, dtype=bool)
                mask[seen(i, key_set)] = True
                logits = np.where(mask, logit(g, slice(None), h, i), -np.inf)
                out[h, i] = _softmax(logits, sink(h)) @ v[g]
                voters = seen(i, memory[g]) if memory else []
                if voters:  # inter attention votes for the memory tokens it used
                    scores[g, voters] += _softmax(logit(g, voters, h, i), sink(h))
        if c == n_chunks - 1:
            break
        new_memory = []
        for g in range(n_kv):
            local_set = set(range(max(start, end - local), end))
            candidates = (set(memory[g]) if memory else set()) | set(range(start, end))
            candidates -= local_set
            ranked = sorted(candidates, key=lambda j: (-scores[g, j], j))
            new_memory.append(sorted(local_set | set(ranked[:heavy])))
        memory = new_memory
        memory_sets.append(memory)
    return out[:, prefix:], memory_sets, scores


def oracle_h2o_output(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, config, scale: float, window: int | None = None
) -> np.ndarray:
    """The oracle's output [Hq, N, D] of one layer under an H2OConfig (its memory_share resolved for
    the N-token prompt): the H2O layer of ReferenceModel.speculator_pass's oracle-built speculator."""
    c = config.for_prompt(q.shape[1])
    if not c.enabled:  # no memory: plain causal attention, as the walk
        return oracle_h2o_layer(q, k, v, q.shape[1], 0, 0, scale, 0, window)[0]
    return oracle_h2o_layer(q, k, v, c.chunk_size, c.local, c.heavy, scale, c.dense_tail, window)[0]


def key_set_mask(
    n_tokens: int,
    chunk_size: int,
    memory_indices: list[np.ndarray],
    n_kv_heads: int,
    dense_tail: int = 0,
    window: int | None = None,
    prefix: int = 0,
) -> np.ndarray:
    """[Hkv, N, N] boolean: mask[g, i, j] = j in K(i) for KV head g.

    memory_indices[c] is M_c as [Hkv, M]; the chunk after c reads it. Rows i >= N - dense_tail
    are causal over every key. A sliding window w keeps j > i - w only. prefix P: chunks start at
    P, the first reads M_{-1} = [0, P) (rows i < P, the prefix's own, are causal: not H2O's).
    """
    pos = np.arange(n_tokens)
    chunk = np.where(pos < prefix, -1, (pos - prefix) // chunk_size)
    intra = (chunk[:, None] == chunk[None, :]) & (pos[None, :] <= pos[:, None])
    intra[pos < prefix] = pos[None, :] <= pos[pos < prefix][:, None]
    intra[np.ix_(chunk == 0, pos < prefix)] = True  # M_{-1}: the whole prefix
    mask = np.repeat(intra[None], n_kv_heads, axis=0)
    for c, mem in enumerate(memory_indices):
        rows = pos[(chunk == c + 1) & (pos >= prefix)]
        for g in range(n_kv_heads):
            mask[g][np.ix_(rows, mem[g])] = True
    tail = pos >= n_tokens - dense_tail
    mask[:, tail] = pos[None, :] <= pos[tail][:, None]
    if window is not None:
        mask &= (pos[:, None] - pos[None, :] < window)[None]
    return mask


def _masked_softmax(logits: np.ndarray, mask: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the masked-in keys; a row with none is all zeros. sinks (broadcastable to the
    rows, logits.shape[:-1]): one more column per row, softmaxed with the keys and dropped."""
    if sinks is not None:
        mask = np.broadcast_to(mask, logits.shape)
        column = np.broadcast_to(np.asarray(sinks, dtype=logits.dtype), logits.shape[:-1])[..., None]
        padded = np.concatenate([logits, column], axis=-1)
        keep = np.concatenate([mask, np.ones(column.shape, dtype=bool)], axis=-1)
        return _masked_softmax(padded, keep)[..., :-1]
    logits = np.where(mask, logits, -np.inf)
    top = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def replay_h2o_layer(
    q, k, v, chunk_size, memory_indices, scale, dense_tail=0, window=None, sinks=None, softcap=None, prefix=0
) -> tuple[np.ndarray, np.ndarray]:
    """(output [Hq, N, Dv], scores [Hkv, N]) that H2O must produce GIVEN these memory sets
    (memory_indices: M_0, M_1, .. as [Hkv, M] positions; the other arguments as oracle_h2o_layer's) (and
    a dense tail of `dense_tail` rows, which changes the output only; a sliding window w, which
    hides keys j <= i - w from query i everywhere; the layer's terms, sinks [Hq] and softcap, in
    every softmax as the module doc says). prefix P: q [Hq, N - P, D] holds the new part's
    queries, the output is theirs [Hq, N - P, Dv]; chunks start at P and the first reads
    M_{-1} = [0, P) (the prefix gets no phase-1 sums).

    Lets a backend be checked exactly even where float ties legitimately change its memory
    sets: whatever sets it chose, its output must be attention over the K(i) they define.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    q = np.concatenate([np.zeros((q.shape[0], prefix, q.shape[2])), q], axis=1)  # row i is position i
    n_heads, n_tokens, _ = q.shape
    n_kv = k.shape[0]
    group = n_heads // n_kv
    kr, vr = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    logits = _capped(np.einsum("hid,hjd->hij", q, kr) * scale, softcap)
    row_sinks = None if sinks is None else np.asarray(sinks, dtype=np.float64)[:, None]  # [Hq, 1] per row
    mask = key_set_mask(n_tokens, chunk_size, memory_indices, n_kv, dense_tail, window, prefix)
    output = _masked_softmax(logits, np.repeat(mask, group, axis=0), row_sinks) @ vr
    pos = np.arange(n_tokens)
    new_chunk = np.where(pos < prefix, -1, (pos - prefix) // chunk_size)
    intra = (new_chunk[:, None] == new_chunk[None, :]) & (pos[None, :] <= pos[:, None]) & (pos >= prefix)[:, None]
    if window is not None:
        intra &= pos[:, None] - pos[None, :] < window
    scores = _masked_softmax(logits, intra, row_sinks).sum(axis=1).reshape(n_kv, group, n_tokens).sum(axis=1)
    first = [np.tile(np.arange(prefix), (n_kv, 1))] if prefix else []  # M_{-1}, read by the first new chunk
    for c, mem in enumerate(first + list(memory_indices)):
        lo = prefix + (c if prefix else c + 1) * chunk_size
        rows = np.arange(lo, min(lo + chunk_size, n_tokens))
        for h in range(n_heads):
            g = h // group
            visible = np.bool_(True) if window is None else rows[:, None] - mem[g][None, :] < window
            weights = _masked_softmax(
                logits[h][np.ix_(rows, mem[g])], visible, None if sinks is None else float(sinks[h])
            )
            scores[g, mem[g]] += weights.sum(axis=0)
    return output[:, prefix:], scores
