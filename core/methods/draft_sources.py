"""Where speculative decoding's drafts come from: one small type per source, one interface.

A source (`SelfDraft`, `ModelDraft`, `SpeculatorDraft`) says how much room the SpecPrefill
speculator's cache needs and where its step costs are kept; core/methods/drafting.prepare_draft
makes the `DraftState` that drafts from it once the first token is known: a draft with its own
cache (a separate draft model, or the speculator continuing from its prompt KV), or a "self:K"
draft writing into the main cache's first K layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..backend import LoadedModel
from ..config import Drafting
from ..errors import ConfigError, PromptTooLongError
from ..hybrid import max_rollback
from ..runtime import SamplingConfig, check_companion, self_speculator_layers

if TYPE_CHECKING:
    from .draft_costs import CostBook


class DraftSource(Protocol):
    """A kind of draft, before decoding starts (made ready by core/methods/drafting.prepare_draft)."""

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
