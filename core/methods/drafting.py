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

Where drafts come from is a source, one small type each with one interface (`DraftSource`: a
"self:K" draft sharing the main cache, `SelfDraft`; a separate draft model, `ModelDraft`; the
SpecPrefill speculator drafting from its prompt KV, `SpeculatorDraft`), made from the request's
Drafting by `draft_source` when the generation is planned (core/plan.py). `prepare_draft` makes a
source's `DraftState`, which proposes and, after the main model's verdict, keeps what was accepted: a draft
with its own cache (`OwnCacheDraft`) trims that cache; a "self:K" draft (`SharedCacheDraft`) writes
into the main cache's first K layers, and the verify pass rewrites those slots with exactly the same
KV, so it only drops its writes before the verify pass. `drafted_decode` is the decode the driver
runs: the first token, the draft's preparation, the rounds, and the step costs kept for the next
decode (core/methods/draft_costs.py). The file reads in that order from the bottom up: the
sources, the draft states, the acceptance rule, a round, the rounds, the decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import numpy as np

from ..backend import LoadedModel
from ..config import Drafting
from ..errors import ConfigError, PromptTooLongError
from ..hybrid import max_rollback
from ..ops import ModelOps
from ..runtime import GenerationInfo, SamplingConfig, check_companion, self_speculator_layers
from ..sampling import HostSampler, draw, probabilities
from ..stages import A
from .draft_length import DraftLength
from .prefill import prefill

if TYPE_CHECKING:
    from .draft_costs import CostBook
    from .specprefill import SparsePrefill

__all__ = [
    "DraftSource",
    "DraftState",
    "accept",
    "acceptance_probability",
    "draft_source",
    "prepare_draft",
    "residual_distribution",
    "speculative_decode",
]


class DraftSource(Protocol):
    """A kind of draft, before decoding starts (made ready by prepare_draft below)."""

    def speculator_room(self, extra: int) -> int:
        """Slots the SpecPrefill speculator's cache keeps beyond the prompt (`extra` if it drafts)."""

    def costs_book(self) -> CostBook | None:
        """Where this draft's step costs measured on this machine are kept (methods/draft_costs.py),
        None for a draft with no prefill of its own or a run that must not follow the clock."""


@dataclass(frozen=True)
class SelfDraft:
    """ "self:K": the main model's first K layers, sharing the main cache (no prefill at all)."""

    layers: int

    def speculator_room(self, extra: int) -> int:
        return 0

    def costs_book(self) -> CostBook | None:
        return None  # no prefill of its own: the adaptive length alone decides, round by round


@dataclass(frozen=True)
class ModelDraft:
    """A separate draft model (the backend's model object): it prefills the whole prompt when
    decoding starts, in steps of `step_size` tokens. book: its step costs measured on this machine
    (methods/draft_costs.py), None where a run must not depend on them (seeded sampling)."""

    model: Any
    step_size: int
    book: CostBook | None = None

    def speculator_room(self, extra: int) -> int:
        return 0

    def costs_book(self) -> CostBook | None:
        return self.book


@dataclass(frozen=True)
class SpeculatorDraft:
    """The SpecPrefill speculator drafting from the prompt KV it built (its look-ahead slots dropped)."""

    def speculator_room(self, extra: int) -> int:
        return extra

    def costs_book(self) -> CostBook | None:
        return None  # its prompt KV is SpecPrefill's own: drafting costs no prefill


def draft_source(main: LoadedModel, drafting: Drafting, needed: int, sampling: SamplingConfig) -> DraftSource:
    """Drafting.model as a draft source for `main`: "self:K", a CausalLM on main's backend (checked
    against main's vocabulary and `needed` = prompt + max_tokens), or None: the speculator (after
    speculative prefill: core/runtime.check_drafting, where the request is made). A draft model
    gets its cost book when the run may follow measured times (not seeded sampling)."""
    for model in (main, drafting.model):
        limit = max_rollback(model.args) if isinstance(model, LoadedModel) else None  # a hybrid's undoes so many
        if limit is not None and drafting.num_tokens > limit:
            raise ConfigError(
                f"num_draft_tokens {drafting.num_tokens} exceeds {limit}, the drafts a hybrid model's cache "
                f"can roll back per round",
                "num_tokens",
                config="Drafting",
            )
    if drafting.model is None:
        return SpeculatorDraft()
    if isinstance(drafting.model, str):
        return SelfDraft(self_speculator_layers(drafting.model, main.args.num_hidden_layers))
    if not isinstance(drafting.model, LoadedModel) or drafting.model.backend != main.backend:
        raise ConfigError(f"the draft model must be a model loaded on the {main.backend} backend or 'self:K'")
    check_companion("draft model", drafting.model.args, main.args, drafting.model.ops, main.ops)
    if needed > drafting.model.args.max_position_embeddings:
        raise PromptTooLongError(
            f"prompt plus max_tokens ({needed} tokens) exceeds the draft model's "
            f"context of {drafting.model.args.max_position_embeddings} tokens"
        )
    book = None
    if sampling.clock_free:
        from .draft_costs import CostBook, cost_key

        book = CostBook(
            cost_key(
                backend=main.backend,
                device=main.device_name,
                dtype=str(main.dtype).rsplit(".", 1)[-1],
                threads=main.ops.compute_threads,
                main=main.args,
                draft=drafting.model.args,
            ),
            drafting.num_tokens,
        )
    return ModelDraft(drafting.model.model, drafting.model.prefill_step_size, book)


@dataclass
class DraftState(ABC):
    """A draft while decoding: `pending` tokens of the stream it has not read yet, fed at RoPE
    positions from `position` into `cache`. drafted / accepted count proposals over the decode;
    seconds holds the wall time of drafting and of the main model's verify passes."""

    model: Any
    cache: Any
    position: int
    pending: list[int]
    drafted: int = 0
    accepted: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "verify": 0.0})
    written: int = 0  # slots this round's proposal wrote to `cache`

    def propose(
        self, ops: ModelOps[A], n: int, sampling: SamplingConfig, rng: np.random.Generator
    ) -> tuple[list[int], list[np.ndarray | None]]:
        """Up to n draft tokens and their draft distributions [vocab] (None when greedy). The
        draft reads its pending tokens, then every draft but the last (`written` slots)."""
        tokens: list[int] = []
        probs: list[np.ndarray | None] = []
        feed, position, self.written = list(self.pending), self.position, 0
        for _ in range(n):
            out = ops.forward(self.model, ops.tokens(np.array(feed)), position, self.cache, None, len(feed) - 1)
            position, self.written = position + len(feed), self.written + len(feed)
            token, q = draw(ops.to_numpy(out[-1]), sampling, rng)
            tokens.append(token)
            probs.append(q)
            feed = [token]
        return tokens, probs

    @abstractmethod
    def keep(self, ops: ModelOps[A], stream: list[int], n_drafts: int, accepted: int) -> None:
        """Roll the draft back to the accepted tokens. stream: the tokens since the round began
        (the pending one, the accepted drafts, the main model's next)."""


class OwnCacheDraft(DraftState):
    """A draft model with a cache of its own (a separate draft model, or the speculator)."""

    def keep(self, ops: ModelOps[A], stream: list[int], n_drafts: int, accepted: int) -> None:
        """The draft read its pending tokens and every draft but the last (`written` slots): it keeps
        the slots of those the main model accepted, and what follows them in the stream is pending."""
        unread = self.pending + stream[1:]  # the stream from the draft's position on
        kept = len(self.pending) + min(accepted, n_drafts - 1) if n_drafts else 0
        self.cache.trim(self.written - kept)
        self.position += kept
        self.pending = unread[kept:]


@dataclass
class SharedCacheDraft(DraftState):
    """A "self:K" draft: the main model's first `layers` layers over the main cache."""

    layers: int = 0

    def propose(
        self, ops: ModelOps[A], n: int, sampling: SamplingConfig, rng: np.random.Generator
    ) -> tuple[list[int], list[np.ndarray | None]]:
        """DraftState.propose, then drop the draft's writes: the verify pass rewrites those slots."""
        tokens, probs = super().propose(ops, n, sampling, rng)
        if self.written:
            self.cache.trim(self.written, self.layers)
        return tokens, probs

    def keep(self, ops: ModelOps[A], stream: list[int], n_drafts: int, accepted: int) -> None:
        """The main cache's layers now hold exactly the kept tokens; the main model's next is pending."""
        self.position += len(stream) - 1
        self.pending = stream[-1:]


def prepare_draft(
    source: DraftSource,
    ops: ModelOps[A],
    main: Any,
    cache: Any,
    ids: np.ndarray,
    first: int,
    sparse: SparsePrefill | None,
    room: int,
) -> DraftState:
    """The draft of `source` ready to read `first` at position len(ids): main / cache are the main
    model and its cache, sparse SpecPrefill's result (None after full prefill), room the decode's
    slots. A draft model prefills the whole prompt here; the speculator drops its look-ahead slots."""
    if isinstance(source, SelfDraft):
        return SharedCacheDraft(ops.first_layers(main, source.layers), cache, len(ids), [first], layers=source.layers)
    if isinstance(source, ModelDraft):
        draft_cache = ops.new_cache(source.model, len(ids) + room)
        prefill(ops, source.model, ops.tokens(ids), 0, draft_cache, step_size=source.step_size)
        return OwnCacheDraft(source.model, draft_cache, len(ids), [first])
    if sparse is None:
        raise ConfigError("the SpecPrefill speculator drafts only after speculative prefill")
    spec = sparse.speculator
    spec.cache.trim(len(spec.lookahead))
    return OwnCacheDraft(spec.model, spec.cache, len(ids), [first])


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
    draft = prepare_draft(source, ops, model, cache, ids, first, sparse, max_tokens + drafting.num_tokens + 2)
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
