"""A generation's plan, resolved once before any model runs: what CausalLM.generate_step will do.

core/request.py checks what needs no model (each setting, how they combine); this module checks
and decides what needs the model and the prompt, in one call (`plan_generation`), so the driver
(core/driver.py) only runs the plan it gets:
- the prompt's ids (batch 1, inside the vocabulary) and the prompt plus max_tokens in the context;
- "auto" resolved on the new part's length (this machine's calibrations: core/probe.py);
- a reused cache checked against the prompt and the method (`check_reuse`);
- SpecPrefill's speculator (a model on this backend and vocabulary, or "self:K"), the prompt in its
  context, its settings clamped to the prompt (core/request.fit_to_prompt) and its reused KV found;
- speculative decoding's draft source (core/methods/drafting.draft_source) and, for a draft model, its
  step costs measured here, which may say that drafting cannot pay (then none runs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .backend import LoadedModel
from .errors import ConfigError, PromptTooLongError
from .request import fit_to_prompt
from .runtime import (
    Drafting,
    GenerationInfo,
    KVState,
    PrefillMethod,
    SamplingConfig,
    check_companion,
    exact_prefix,
    self_speculator_layers,
)

if TYPE_CHECKING:
    from .decoding import LogitsProcessor
    from .methods.draft_costs import CostBook
    from .methods.drafting import DraftSource


@dataclass(frozen=True)
class GenerationPlan:
    """What one generation runs, every choice made: the checked prompt ids [P] (int64 NumPy), the
    method ("auto" resolved, SpecPrefill's settings fitted to the prompt), the reused cache (None: a
    new one), the speculator (model, its prefill step) and its reused KV (cache, tokens), the draft
    source (None: plain decoding) and the cost book that skipped a draft (the reply is noted in it)."""

    ids: np.ndarray
    method: PrefillMethod
    max_tokens: int
    sampling: SamplingConfig
    stop_ids: frozenset[int]
    processors: tuple[LogitsProcessor, ...] = ()
    reuse: KVState | None = None
    speculator: tuple[Any, int] | None = None
    speculator_cache: tuple[Any, int] | None = None
    draft: DraftSource | None = None
    drafting: Drafting | None = None
    book: CostBook | None = None

    @property
    def extra_slots(self) -> int:
        """Cache slots after the prompt: the reply, and a drafted round's tokens beyond it."""
        return self.max_tokens + (0 if self.drafting is None else self.drafting.num_tokens + 1)


def plan_generation(
    model: Any,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_ids: frozenset[int],
    method: PrefillMethod,
    info: GenerationInfo,
    drafting: Drafting | None = None,
    reuse: KVState | None = None,
    processors: Sequence[LogitsProcessor] = (),
) -> GenerationPlan:
    """The plan of CausalLM.generate_step's arguments for `model` (a CausalLM), every check of the
    model and the prompt made here, before any model runs; info.start is called with the method
    that will run. Raises ConfigError / PromptTooLongError / TokenizerMismatchError (one line)."""
    ids = checked_ids(prompt_ids, max_tokens, model.args)
    if processors and drafting is not None:
        raise ConfigError(
            "num_draft_tokens (speculative decoding) with logits processors is not supported", config="Drafting"
        )
    cached = 0 if reuse is None else reuse.tokens
    began, measured = time.perf_counter(), []
    method = resolve_method(model, method, len(ids) - cached, cached, measured.append)  # auto: the new part
    info.start(len(ids), method.label)
    if measured:  # auto's calibration measured in this request: in its time to first token, named apart
        info.seconds["auto_calibration"] = time.perf_counter() - began
    if reuse is not None:
        check_reuse(reuse, len(ids), method, drafting)
    speculator = speculator_cache = None
    if method.name == "specprefill":  # a bad speculator fails here, not at the first token
        speculator = speculator_of(model, method.speculator)
        context = speculator[0].args.max_position_embeddings
        check_speculator_context(len(ids), context)
        method = fit_to_prompt(method, len(ids), context)
        speculator_cache = None if reuse is None else reused_speculator_kv(reuse, speculator[0])
    source = book = None
    if drafting is not None:
        from .methods.drafting import draft_source  # drafting loads only when asked

        source = draft_source(model, drafting, len(ids) + max_tokens, sampling)
        book = source.costs_book() if drafting.adaptive else None
    if book is not None and (why := book.skip_reason(len(ids), max_tokens)):
        info.decode.skipped, source, drafting = why, None, None  # plain decoding, no draft prefill
    else:
        book = None
    return GenerationPlan(
        ids, method, max_tokens, sampling, stop_ids, tuple(processors), reuse, speculator, speculator_cache,
        source, drafting, book,
    )  # fmt: skip


def checked_ids(ids: Any, max_tokens: int, args: Any) -> np.ndarray:
    """The prompt's ids checked (check_token_ids) and, with max_tokens, fitting args' context."""
    checked = check_token_ids(ids, args.vocab_size)
    check_generation_fits(len(checked), max_tokens, args.max_position_embeddings)
    return checked


def resolve_method(
    model: Any,
    method: PrefillMethod,
    n_tokens: int,
    cached: int = 0,
    announce: Callable[[str], None] | None = None,
) -> PrefillMethod:
    """ "auto" -> the sparse method this machine's calibrations find fastest for n_tokens (new
    tokens over `cached` reused ones), full prefill below every crossover (core/probe.auto_choice;
    `announce` gets a line before a calibration is measured); with method.auto_threshold,
    method.sparse from it on (the new part's length against it); other methods as they are."""
    if method.name != "auto":
        return method
    threshold = method.auto_threshold
    if threshold is None:  # this machine's calibrations choose among the sparse methods (core/probe.py)
        from .probe import auto_choice

        return auto_choice(model, method, n_tokens, cached, announce)[0]
    return replace(method, name=method.sparse if n_tokens >= threshold else "full", auto_threshold=None)


def speculator_of(main: Any, speculator: Any) -> tuple[Any, int]:
    """(speculator model, its prefill step size) for PrefillMethod.speculator: a loaded model on
    main's backend with main's vocabulary, or "self:K" (main's first K layers, shared)."""
    if isinstance(speculator, str):
        layers = self_speculator_layers(speculator, main.args.num_hidden_layers)
        return main.ops.first_layers(main.model, layers), main.prefill_step_size
    if not isinstance(speculator, LoadedModel) or speculator.backend != main.backend:
        what = (
            f"a model on the {speculator.backend} backend"
            if isinstance(speculator, LoadedModel)
            else type(speculator).__name__
        )
        raise ConfigError(
            f"the speculator must be a model loaded on the {main.backend} backend or 'self:K', got {what}"
        )
    check_companion("speculator", speculator.args, main.args, speculator.ops, main.ops)
    return speculator.model, speculator.prefill_step_size


def reused_speculator_kv(reuse: KVState, speculator: Any) -> tuple[Any, int] | None:
    """(the speculator's cache, its tokens to reuse) from reuse.speculator, cut to the main
    model's reused prefix (the tokens the prompt matched); None: the speculator reads the prompt
    from its start. A cache of another speculator's shape is refused."""
    kept = reuse.speculator
    if kept is None or min(kept.slots, reuse.tokens) < 1:
        return None
    if len(kept.cache.layers) != speculator.args.num_hidden_layers:
        raise ConfigError(
            f"the reused speculator KV has {len(kept.cache.layers)} layers, not the speculator's: "
            "pass the KV the same speculator built"
        )
    return kept.cache, min(kept.slots, reuse.tokens)


def check_reuse(reuse: KVState, prompt_tokens: int, method: PrefillMethod, drafting: Drafting | None) -> None:
    """A reused cache must stand for a proper prefix of the prompt and is extended by full prefill, or
    from a dense prefix (slot i = token i) by H2O or by SpecPrefill (over an H2O speculator too):
    docs/methods.md; without speculative decoding (yet); a hybrid's, at a point where it kept its
    recurrent state."""
    if drafting is not None:
        raise ConfigError(
            "speculative decoding with a reused KV cache is not supported yet", "num_tokens", config="Drafting"
        )
    if method.name == "specprefill":  # SpecPrefill from a reused prefix: docs/methods.md
        if reuse.position_offset != 0:
            raise ConfigError(
                "a reused KV cache from SpecPrefill (its slots hold kept tokens) is extended by full prefill only"
            )
    elif method.name == "h2o" and reuse.position_offset:
        raise ConfigError(
            f"H2O from a reused KV cache needs a dense prefix (slot i = token i); this one holds SpecPrefill's "
            f"kept tokens (position offset {reuse.position_offset}): reuse it with full prefill"
        )
    elif method.name not in ("full", "h2o"):
        raise ConfigError(
            f"a reused KV cache is extended by full, H2O or SpecPrefill prefill only, got method {method.name!r}"
        )
    if not 0 < reuse.tokens < prompt_tokens or reuse.slots < 1:
        raise ConfigError(
            f"a reused KV cache of {reuse.tokens} tokens must cover 1 .. {prompt_tokens - 1} of "
            f"the {prompt_tokens} prompt tokens"
        )
    exact = exact_prefix(reuse.cache, reuse.slots)  # a hybrid's cache: only where it kept the recurrent state
    if exact != reuse.slots:
        raise ConfigError(
            f"a hybrid model's reused KV cache cannot be cut to {reuse.slots} slots: its recurrent state is "
            f"kept at {exact} at most below that (reuse that many tokens)"
        )


def check_generation_fits(prompt_tokens: int, max_tokens: int, context: int) -> None:
    """max_tokens is >= 0 and the prompt plus max_tokens fit the model's context."""
    if max_tokens < 0:
        raise ConfigError(f"max_tokens must be >= 0, got {max_tokens}")
    if prompt_tokens + max_tokens > context:
        raise PromptTooLongError(
            f"prompt of {prompt_tokens} tokens plus max_tokens "
            f"{max_tokens} exceeds the model's context of {context} tokens"
        )


def check_token_ids(ids: Any, vocab_size: int) -> np.ndarray:
    """Token ids (a sequence of ints or an integer array [T] or [1, T]) as int64 NumPy [T],
    checked: batch 1, not empty, integers inside the vocabulary."""
    ids = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids))
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or ids.size == 0:
        raise ConfigError(f"token ids must be a non-empty sequence (batch 1), got shape {tuple(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"token ids must be integers, got {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ConfigError(f"token id {low if low < 0 else high} is outside the vocabulary (size {vocab_size})")
    return ids.astype(np.int64)


def check_speculator_context(prompt_tokens: int, context: int) -> None:
    """The speculator reads the whole prompt, so it must fit the speculator's context too."""
    if prompt_tokens > context:
        raise PromptTooLongError(
            f"prompt of {prompt_tokens} tokens exceeds the speculator's context of {context} tokens"
        )
