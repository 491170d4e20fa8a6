"""Where speculative decoding's drafts come from: one small type per source, one interface.

A source (`SelfDraft`, `ModelDraft`, `SpeculatorDraft`) says how much room the SpecPrefill
speculator's cache needs and prepares a `DraftState` once the first token is known. The state
proposes up to n tokens per round and, after the main model's verdict, keeps what was accepted:
a draft with its own cache (`OwnCacheDraft`: a separate draft model, or the speculator continuing
from its prompt KV) trims that cache; a "self:K" draft (`SharedCacheDraft`) writes into the main
cache's first K layers, and the verify pass rewrites those slots with exactly the same KV, so it
only drops its writes before the verify pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..backend import LoadedModel
from ..config import Drafting
from ..errors import ConfigError, PromptTooLongError
from ..hybrid import max_rollback
from ..ops import ModelOps
from ..runtime import SamplingConfig, check_companion, self_speculator_layers
from ..sampling import draw
from ..stages import A
from .prefill import prefill

if TYPE_CHECKING:
    from .draft_costs import CostBook
from .specprefill import SparsePrefill


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


class DraftSource(Protocol):
    """A kind of draft, before decoding starts."""

    def speculator_room(self, extra: int) -> int:
        """Slots the SpecPrefill speculator's cache keeps beyond the prompt (`extra` if it drafts)."""

    def prepare(
        self,
        ops: ModelOps[A],
        main: Any,
        cache: Any,
        ids: np.ndarray,
        first: int,
        sparse: SparsePrefill | None,
        room: int,
    ) -> DraftState:
        """The draft ready to read `first` at position len(ids): main / cache are the main model and
        its cache, sparse SpecPrefill's result (None after full prefill), room the decode's slots."""

    def costs_book(self) -> CostBook | None:
        """Where this draft's step costs measured on this machine are kept (methods/draft_costs.py),
        None for a draft with no prefill of its own or a run that must not follow the clock."""


@dataclass(frozen=True)
class SelfDraft:
    """ "self:K": the main model's first K layers, sharing the main cache (no prefill at all)."""

    layers: int

    def speculator_room(self, extra: int) -> int:
        return 0

    def prepare(
        self,
        ops: ModelOps[A],
        main: Any,
        cache: Any,
        ids: np.ndarray,
        first: int,
        sparse: SparsePrefill | None,
        room: int,
    ) -> DraftState:
        return SharedCacheDraft(ops.first_layers(main, self.layers), cache, len(ids), [first], layers=self.layers)

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

    def prepare(
        self,
        ops: ModelOps[A],
        main: Any,
        cache: Any,
        ids: np.ndarray,
        first: int,
        sparse: SparsePrefill | None,
        room: int,
    ) -> DraftState:
        draft_cache = ops.new_cache(self.model, len(ids) + room)
        prefill(ops, self.model, ops.tokens(ids), 0, draft_cache, step_size=self.step_size)
        return OwnCacheDraft(self.model, draft_cache, len(ids), [first])

    def costs_book(self) -> CostBook | None:
        return self.book


@dataclass(frozen=True)
class SpeculatorDraft:
    """The SpecPrefill speculator drafting from the prompt KV it built (its look-ahead slots dropped)."""

    def speculator_room(self, extra: int) -> int:
        return extra

    def prepare(
        self,
        ops: ModelOps[A],
        main: Any,
        cache: Any,
        ids: np.ndarray,
        first: int,
        sparse: SparsePrefill | None,
        room: int,
    ) -> DraftState:
        if sparse is None:
            raise ConfigError("the SpecPrefill speculator drafts only after speculative prefill")
        spec = sparse.speculator
        spec.cache.trim(len(spec.lookahead))
        return OwnCacheDraft(spec.model, spec.cache, len(ids), [first])

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
