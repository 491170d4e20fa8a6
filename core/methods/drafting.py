"""Speculative decoding with a draft model (seed 002, "Relation to Speculative Decoding"), written
once over `ModelOps`.

Each round the draft proposes up to k tokens (k chosen per round from the running acceptance and the
measured step costs: core/methods/draft_length.py) one at a time; the main model scores the pending
token and the k drafts in one forward pass; drafts are accepted left to right (greedy: while they
equal the main model's argmax; sampling: with probability min(1, p/q), a rejection resampling
from normalise(max(p - q, 0))), then one token from the main model follows (the correction, or a
bonus after k accepted drafts). The output is then token for token plain greedy decoding, or
distributed exactly as the main model's sampling. Both caches roll back to the accepted tokens
(`LayerCache.trim`). Decisions run on the host (NumPy, float64 probabilities): k + 1 rows of
logits per round, small beside a forward pass.

Where drafts come from (a "self:K" draft sharing the main cache, a separate draft model, the
SpecPrefill speculator) and how each keeps its cache in step: core/methods/draft_sources.py.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..ops import ModelOps
from ..runtime import SamplingConfig
from ..sampling import probabilities
from ..stages import A
from .draft_length import DraftLength
from .draft_sources import DraftState

__all__ = ["accept", "acceptance_probability", "residual_distribution", "speculative_decode"]


def acceptance_probability(p: np.ndarray, q: np.ndarray, token: int) -> float:
    """Probability of keeping a draft `token` drawn from q when the main model says p."""
    return min(1.0, p[token] / q[token])


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Where a rejected draft's replacement is drawn from: normalise(max(p - q, 0)); p itself
    when p == q (a rejection then has probability 0)."""
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def accept(
    drafts: list[int],
    draft_probs: list[np.ndarray],
    logits: np.ndarray,
    sampling: SamplingConfig,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """(accepted draft count n, the main model's next token) from the main logits [len(drafts) + 1,
    vocab]: row i is the main model's distribution for the token after draft i - 1."""
    if sampling.temperature == 0.0:
        for i, token in enumerate(drafts):
            target = int(np.argmax(logits[i]))
            if target != token:
                return i, target
        return len(drafts), int(np.argmax(logits[len(drafts)]))
    for i, (token, q) in enumerate(zip(drafts, draft_probs)):
        p = probabilities(logits[i], sampling)
        if rng.random() >= acceptance_probability(p, q, token):
            return i, int(rng.choice(p.size, p=residual_distribution(p, q)))
    p = probabilities(logits[len(drafts)], sampling)
    return len(drafts), int(rng.choice(p.size, p=p))


def speculative_decode(
    ops: ModelOps[A],
    model: Any,
    cache: Any,
    first: int,
    *,
    next_position: int,
    draft: DraftState,
    length: DraftLength,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_ids: frozenset[int],
    rng: np.random.Generator,
) -> Iterator[tuple[int, bool]]:
    """After the first token (already yielded by the caller, not yet in any cache), yield
    (token, from_draft) until a stop id or `max_tokens` tokens in all (the first included).
    `length` chooses each round's number of drafts and learns from the round's acceptance and times."""
    produced, pending = 1, first
    while produced < max_tokens:
        n = length.next(max_tokens - produced - 1)
        started = ops.wall_time()
        drafts, probs = draft.propose(ops, n, sampling, rng)
        verified = ops.wall_time()
        with ops.verify_scope():
            out = ops.forward(model, ops.tokens(np.array([pending] + drafts)), next_position, cache, None, 0)
        accepted, following = accept(drafts, probs, ops.to_numpy(out), sampling, rng)
        cache.trim(len(drafts) - accepted)
        draft.keep(ops, [pending] + drafts[:accepted] + [following], len(drafts), accepted)
        next_position += 1 + accepted
        draft.drafted, draft.accepted = draft.drafted + len(drafts), draft.accepted + accepted
        finished = ops.wall_time()
        length.record(len(drafts), accepted, verified - started, finished - verified)
        draft.seconds["draft"] += verified - started
        draft.seconds["verify"] += finished - verified
        for i, token in enumerate(drafts[:accepted] + [following]):
            produced += 1
            yield token, i < accepted
            if token in stop_ids or produced == max_tokens:
                return
        pending = following
