"""Speculative decoding with a draft model (seed 002, "Relation to Speculative Decoding"), written
once over `ModelOps`.

Each round the draft proposes up to k tokens one at a time; the main model scores the pending
token and the k drafts in one forward pass; drafts are accepted left to right (greedy: while they
equal the main model's argmax; sampling: with probability min(1, p/q), a rejection resampling
from normalise(max(p - q, 0))), then one token from the main model follows (the correction, or a
bonus after k accepted drafts). The output is then token for token plain greedy decoding, or
distributed exactly as the main model's sampling. Both caches roll back to the accepted tokens
(`LayerCache.trim`). Decisions run on the host (NumPy, float64 probabilities): k + 1 rows of
logits per round, small beside a forward pass.

Draft caches: a separate draft model has its own cache over the whole prompt (the speculator's
cache from speculative prefill, or a dense prefill of the draft after the first token); a
"self:K" draft is the main model's first K layers and shares the main cache's first K layers
(their KV of every main-model token is exactly the draft's), so it needs no prefill at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ..ops import ModelOps
from ..runtime import SamplingConfig
from ..stages import A


def distribution(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """The sampling distribution [vocab] (float64) of float logits [vocab]: temperature, then the
    smallest set of tokens whose probability reaches top_p, renormalised (the backends' rule)."""
    scaled = logits.astype(np.float64) / sampling.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of strictly more likely tokens
        cut = np.zeros_like(probs)
        cut[order] = np.where(before < sampling.top_p, probs[order], 0.0)
        probs = cut / cut.sum()
    return probs


def acceptance_probability(p: np.ndarray, q: np.ndarray, token: int) -> float:
    """Probability of keeping a draft `token` drawn from q when the main model says p."""
    return min(1.0, p[token] / q[token])


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Where a rejected draft's replacement is drawn from: normalise(max(p - q, 0)); p itself
    when p == q (a rejection then has probability 0)."""
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def accept(drafts: list[int], draft_probs: list[np.ndarray], logits: np.ndarray, sampling: SamplingConfig,
           rng: np.random.Generator) -> tuple[int, int]:
    """(accepted draft count n, the main model's next token) from the main logits [len(drafts) + 1,
    vocab]: row i is the main model's distribution for the token after draft i - 1."""
    if sampling.temperature == 0.0:
        for i, token in enumerate(drafts):
            target = int(np.argmax(logits[i]))
            if target != token:
                return i, target
        return len(drafts), int(np.argmax(logits[len(drafts)]))
    for i, (token, q) in enumerate(zip(drafts, draft_probs)):
        p = distribution(logits[i], sampling)
        if rng.random() >= acceptance_probability(p, q, token):
            return i, int(rng.choice(p.size, p=residual_distribution(p, q)))
    p = distribution(logits[len(drafts)], sampling)
    return len(drafts), int(rng.choice(p.size, p=p))


@dataclass
class DraftState:
    """A draft model while decoding: `pending` tokens of the stream it has not read yet, fed at
    RoPE positions from `position`; shared_layers = K for a "self:K" draft reading the main cache."""

    model: Any
    cache: Any
    position: int
    pending: list[int]
    shared_layers: int | None = None
    drafted: int = 0
    accepted: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "verify": 0.0})


def _propose(ops: ModelOps[A], draft: DraftState, n: int, sampling: SamplingConfig,
             rng: np.random.Generator) -> tuple[list[int], list[np.ndarray], int]:
    """Up to n draft tokens (and their draft distributions); returns them and how many tokens the
    draft wrote to its cache (its pending ones, then all drafts but the last)."""
    tokens: list[int] = []
    probs: list[np.ndarray] = []
    feed, position, written = list(draft.pending), draft.position, 0
    for _ in range(n):
        out = ops.forward(draft.model, ops.tokens(np.array(feed)), position, draft.cache, None, len(feed) - 1)
        position, written = position + len(feed), written + len(feed)
        logits = ops.to_numpy(out[-1])
        q = distribution(logits, sampling) if sampling.temperature > 0 else None
        token = int(rng.choice(q.size, p=q)) if q is not None else int(np.argmax(logits))
        tokens.append(token)
        probs.append(q)
        feed = [token]
    return tokens, probs, written


def speculative_decode(ops: ModelOps[A], model: Any, cache: Any, first: int, *, next_position: int,
                       draft: DraftState, num_draft_tokens: int, max_tokens: int, sampling: SamplingConfig,
                       stop_ids: frozenset[int], rng: np.random.Generator) -> Iterator[tuple[int, bool]]:
    """After the first token (already yielded by the caller, not yet in any cache), yield
    (token, from_draft) until a stop id or `max_tokens` tokens in all (the first included)."""
    produced, pending = 1, first
    while produced < max_tokens:
        n = min(num_draft_tokens, max_tokens - produced - 1)
        started = ops.wall_time()
        drafts, probs, written = _propose(ops, draft, n, sampling, rng) if n > 0 else ([], [], 0)
        if draft.shared_layers is not None and written:
            ops.trim(cache, written, draft.shared_layers)  # the verify pass rewrites those slots
        verified = ops.wall_time()
        out = ops.forward(model, ops.tokens(np.array([pending] + drafts)), next_position, cache, None, 0)
        accepted, following = accept(drafts, probs, ops.to_numpy(out), sampling, rng)
        ops.trim(cache, len(drafts) - accepted)
        _roll_back_draft(ops, draft, [pending] + drafts[:accepted] + [following], written, len(drafts), accepted)
        next_position += 1 + accepted
        draft.drafted, draft.accepted = draft.drafted + len(drafts), draft.accepted + accepted
        draft.seconds["draft"] += verified - started
        draft.seconds["verify"] += ops.wall_time() - verified
        for i, token in enumerate(drafts[:accepted] + [following]):
            produced += 1
            yield token, i < accepted
            if token in stop_ids or produced == max_tokens:
                return
        pending = following


def _roll_back_draft(ops: ModelOps[A], draft: DraftState, stream: list[int], written: int, n_drafts: int,
                     accepted: int) -> None:
    """Keep the draft's cache entries of accepted tokens; what it has not read becomes pending.
    stream: the tokens since the round began (pending, accepted drafts, the main model's next)."""
    if draft.shared_layers is not None:  # the main cache's layers now hold exactly the kept tokens
        draft.position += len(stream) - 1
        draft.pending = stream[-1:]
        return
    kept = len(draft.pending) + min(accepted, max(n_drafts - 1, 0)) if n_drafts else 0
    ops.trim(draft.cache, written - kept)
    draft.position += kept
    draft.pending = draft.pending[kept:] + stream[1:] if kept < len(draft.pending) else stream[1 + kept - len(draft.pending):]
