"""Speculative decoding with a draft model (seed 002, "Relation to Speculative Decoding"), written
once over `ModelOps`.

A round, in three steps (`play_round`):
1. propose: the draft proposes up to k tokens one at a time (k chosen per round from the running
   acceptance and the measured step costs: core/methods/draft_length.py);
2. verify: the main model scores the pending token and the k drafts in one forward pass;
3. accept and roll back: drafts are accepted left to right (greedy: while they equal the main
   model's argmax; sampling: with probability min(1, p/q), a rejection resampling from
   normalise(max(p - q, 0))), then one token from the main model follows (the correction, or a
   bonus after k accepted drafts); both caches roll back to the accepted tokens (`LayerCache.trim`).
The output is then token for token plain greedy decoding, or distributed exactly as the main
model's sampling. Decisions run on the host (NumPy, float64 probabilities: core/sampling.py): k + 1
rows of logits per round, small beside a forward pass.

Where drafts come from (a "self:K" draft sharing the main cache, a separate draft model, the
SpecPrefill speculator) and how each keeps its cache in step: core/methods/draft_sources.py.
`drafted_decode` is the decode the driver runs: the first token, the draft's preparation, the rounds,
and the step costs kept for the next decode (core/methods/draft_costs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..config import Drafting
from ..ops import ModelOps
from ..runtime import GenerationInfo, SamplingConfig
from ..sampling import HostSampler, draw, probabilities
from ..stages import A
from .draft_length import DraftLength
from .draft_sources import DraftSource, DraftState

if TYPE_CHECKING:
    from .specprefill import SparsePrefill

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


def correction(
    token: int, q: np.ndarray | None, logits: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator
) -> int | None:
    """None when the main model, saying logits [vocab], keeps the draft `token` (drawn from q, None
    when greedy); else the token it takes instead."""
    if sampling.temperature == 0.0:
        target = int(np.argmax(logits))
        return None if target == token else target
    p = probabilities(logits, sampling)
    if rng.random() < acceptance_probability(p, q, token):
        return None
    return int(rng.choice(p.size, p=residual_distribution(p, q)))


def accept(
    drafts: list[int],
    draft_probs: list[np.ndarray],
    logits: np.ndarray,
    sampling: SamplingConfig,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """(accepted draft count n, the main model's next token) from the main logits [len(drafts) + 1,
    vocab]: row i is the main model's distribution for the token after draft i - 1."""
    for i, (token, q) in enumerate(zip(drafts, draft_probs, strict=True)):
        instead = correction(token, q, logits[i], sampling, rng)
        if instead is not None:
            return i, instead
    return len(drafts), draw(logits[len(drafts)], sampling, rng)[0]


def verify(ops: ModelOps[A], model: Any, cache: Any, tokens: list[int], position: int) -> np.ndarray:
    """The main model's logits [len(tokens), vocab] (host) for the pending token and the drafts, in
    one forward pass at RoPE positions from `position` (into the cache's next free slots)."""
    with ops.verify_scope():
        out = ops.forward(model, ops.tokens(np.array(tokens)), position, cache, None, 0)
    return ops.to_numpy(out)


@dataclass
class Round:
    """What a round did: its drafts, how many the main model accepted, the main model's token after
    them, and the wall time of drafting and of the verify pass."""

    drafts: list[int]
    accepted: int
    following: int
    draft_seconds: float
    verify_seconds: float

    def tokens(self) -> list[tuple[int, bool]]:
        """The round's output: (token, from_draft) for the accepted drafts, then the main model's."""
        return [(t, True) for t in self.drafts[: self.accepted]] + [(self.following, False)]


def play_round(
    ops: ModelOps[A],
    model: Any,
    cache: Any,
    pending: int,
    position: int,
    draft: DraftState,
    n: int,
    sampling: SamplingConfig,
    rng: np.random.Generator,
) -> Round:
    """Propose n drafts, verify them after `pending` (the last token, at `position`, in no cache
    yet), accept a prefix and roll both caches back to it."""
    started = ops.wall_time()
    drafts, probs = draft.propose(ops, n, sampling, rng)
    verified = ops.wall_time()
    accepted, following = accept(drafts, probs, verify(ops, model, cache, [pending] + drafts, position), sampling, rng)
    cache.trim(len(drafts) - accepted)
    draft.keep(ops, [pending] + drafts[:accepted] + [following], len(drafts), accepted)
    return Round(drafts, accepted, following, verified - started, ops.wall_time() - verified)


def note_round(draft: DraftState, length: DraftLength, done: Round) -> None:
    """Count a round in the draft's totals and let `length` learn from its acceptance and times."""
    draft.drafted, draft.accepted = draft.drafted + len(done.drafts), draft.accepted + done.accepted
    length.record(len(done.drafts), done.accepted, done.draft_seconds, done.verify_seconds)
    draft.seconds["draft"] += done.draft_seconds
    draft.seconds["verify"] += done.verify_seconds


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
        done = play_round(ops, model, cache, pending, next_position, draft, n, sampling, rng)
        next_position += 1 + done.accepted
        note_round(draft, length, done)
        for token, from_draft in done.tokens():
            produced += 1
            yield token, from_draft
            if token in stop_ids or produced == max_tokens:
                return
        pending = done.following


def drafted_decode(
    ops: ModelOps[A],
    model: Any,
    ids: np.ndarray,
    last: np.ndarray,
    cache: Any,
    source: DraftSource,
    sparse: SparsePrefill | None,
    drafting: Drafting,
    *,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_ids: frozenset[int],
    info: GenerationInfo,
) -> Iterator[int]:
    """The first token from the prefill's last logits [vocab] (host), then speculative decoding
    with the draft `source` prepared to read it (a draft model prefills the prompt here). The draft
    length adapts unless drafting.adaptive is off; a seeded sampling run ignores the clock (repeatable).
    info.decode gets the counts, the times and each token's origin."""
    sampler = HostSampler(sampling)  # its generator draws the drafts and the main model's tokens too
    first = sampler.choose(last)
    info.decode.from_draft.append(False)
    yield first
    if first in stop_ids or max_tokens == 1:
        return
    started = ops.wall_time()
    draft = source.prepare(ops, model, cache, ids, first, sparse, max_tokens + drafting.num_tokens + 2)
    info.decode.seconds["draft_prefill"] = ops.wall_time() - started
    length = DraftLength(drafting.num_tokens, adaptive=drafting.adaptive, timed=sampling.clock_free)
    book = source.costs_book()
    if book is not None:
        book.seed(length)  # costs kept from earlier runs: no single slow first measurement decides
    info.decode.draft_lengths = length.trajectory

    def keep_costs(stopped: bool) -> None:
        if book is not None:
            seconds, reply = info.decode.seconds["draft_prefill"], (produced, stopped)
            book.remember(length, seconds, len(ids), draft.drafted, draft.accepted, reply)

    produced = 1
    rounds = speculative_decode(
        ops,
        model,
        cache,
        first,
        next_position=len(ids),
        draft=draft,
        length=length,
        max_tokens=max_tokens,
        sampling=sampling,
        stop_ids=stop_ids,
        rng=sampler.rng,
    )
    for token, from_draft in rounds:
        info.decode.drafted_tokens, info.decode.accepted_tokens = draft.drafted, draft.accepted
        info.decode.seconds.update(draft.seconds)
        info.decode.from_draft.append(from_draft)
        produced += 1
        if token in stop_ids or produced == max_tokens:
            keep_costs(token in stop_ids)  # before the last token: a reader stops there, never resuming us
            yield token
            return
        try:
            yield token
        except GeneratorExit:  # closed early (a stop string, a cancel): what was measured still counts
            keep_costs(True)
            raise
