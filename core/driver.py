"""The generation driver, written once: it runs a generation's plan (core/plan.py, every choice made
and checked before any model runs): prefill by method, decode loop, stop handling, statistics.

`CausalLM` is what `specfill.load` returns on every backend: a backend model plus that backend's
`ModelOps` (core/ops.py). The methods it dispatches to live in core/methods/; h2o, specprefill,
drafting and the auto probe are imported where they run (start-up: docs/development.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .backend import DEFAULT_PREFILL_STEP_SIZE, LoadedModel  # noqa: F401 (DEFAULT_PREFILL_STEP_SIZE: re-exported)
from .checks import check_logits_finite
from .config import H2OConfig, SpecPrefillConfig
from .decoding import LogitsProcessor, decode_tokens, track_kv
from .errors import ConfigError
from .methods.prefill import StageProgress, prefill
from .plan import GenerationPlan, checked_ids, plan_generation, resolve_method, speculator_of
from .runtime import (
    Drafting,
    GenerationInfo,
    KVState,
    PrefillMethod,
    ProgressCallback,
    RecurrentCache,
    SamplingConfig,
)
from .stages import A

if TYPE_CHECKING:
    from .methods.specprefill import SparsePrefill


class CausalLM(LoadedModel[A]):
    """A Llama/Mistral/Qwen2/Qwen3/Gemma 3 model on one backend (core/backend.py) and its generation.

    prefill_step_size: tokens per full-attention prefill step (bounds activation memory).
    """

    def __call__(self, ids: Any) -> A:
        """Logits [1, T, vocab] (float32) for every position of `ids` (ints, NumPy or the backend's array)."""
        ids = checked_ids(ids if isinstance(ids, (list, tuple, np.ndarray)) else self.ops.to_numpy(ids), 0, self.args)
        with self.ops.device_scope():
            cache = self.ops.new_cache(self.model, len(ids))
            logits = prefill(
                self.ops, self.model, self.ops.tokens(ids), 0, cache, step_size=self.prefill_step_size, logits_from=0
            )
        return logits[None]

    def prompt_logits(self, prompt_ids: Sequence[int], *, method: PrefillMethod, info: GenerationInfo) -> np.ndarray:
        """Logits [T, vocab] float32 NumPy for every prompt position under `method` ("full", "h2o"
        or "auto" resolving to one; SpecPrefill drops tokens, so it has none). For perplexity, parity."""
        ids = checked_ids(prompt_ids, 0, self.args)
        method = resolve_method(self, method, len(ids))
        if method.name == "specprefill":
            raise ConfigError("speculative prefill drops prompt tokens: it has no per-position logits")
        info.start(len(ids), method.name)
        with self.ops.device_scope():
            logits = self.prefill_prompt(ids, self.ops.new_cache(self.model, len(ids)), method, info, logits_from=0)
            return self.ops.to_numpy(logits)

    def prefill_prompt(
        self,
        ids: np.ndarray,
        cache: list[Any],
        method: PrefillMethod,
        info: GenerationInfo,
        *,
        logits_from: int = -1,
        progress: ProgressCallback | None = None,
        start: int = 0,
    ) -> A:
        """Full or H2O prefill of every prompt token (slots and positions 0..N-1); float32 logits
        from index `logits_from` on. Fills info.seconds["prefill"] (and the memory sets). H2O steps by
        whole chunks (h2o_step_size), else the full prefill; `progress(done, total)` after each step.
        start: the first `start` tokens are in `cache` already (a reused prefix, slot i = token i):
        only ids[start:] are prefilled, at positions start.., and H2O walks them from the prefix
        (docs/methods.md, H2O from a reused prefix); logits are the new tokens'."""
        started, attend, step = self.ops.wall_time(), None, self.prefill_step_size
        if method.name == "h2o":
            from .methods.h2o import h2o_prefill

            attend, step = h2o_prefill(self.ops, method.h2o or H2OConfig(), self.args, len(ids), step, origin=start)
        logits = prefill(
            self.ops,
            self.model,
            self.ops.tokens(ids[start:]),
            start,
            cache,
            step_size=step,
            logits_from=logits_from,
            attend=attend,
            progress=progress,
        )
        if method.name == "h2o" and info.record_memory:
            info.memory_sets = (
                attend.memory_sets(self.ops.to_numpy)
                if attend is not None
                else [[] for _ in range(self.args.num_hidden_layers)]
            )
        info.seconds["prefill"] = self.ops.wall_time() - started
        return logits

    def speculator_model(self, speculator: Any) -> tuple[Any, int]:
        """(speculator model, its prefill step size) for PrefillMethod.speculator: a CausalLM on this
        backend with this model's vocabulary, or "self:K" (this model's first K layers, shared)."""
        return speculator_of(self, speculator)

    def generate_step(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingConfig,
        stop_ids: frozenset[int],
        method: PrefillMethod,
        info: GenerationInfo,
        progress: ProgressCallback | None = None,
        drafting: Drafting | None = None,
        reuse: KVState | None = None,
        logits_processors: Sequence[LogitsProcessor] = (),
    ) -> Iterator[int]:
        """Prefill `prompt_ids` with `method`, then yield generated token ids one at a time (the
        first yield marks the time to first token), stopping after a stop id or max_tokens.
        With `drafting`, decode speculatively (core/methods/drafting.py): same tokens as greedy,
        the main model's distribution when sampling; info.decode.from_draft marks accepted drafts.
        reuse: a KVState (info.kv of an earlier generation) standing for a prefix of prompt_ids:
        only the rest is prefilled into that cache (grown if needed): with full attention, with method
        h2o by H2O walked from the prefix, with method specprefill sparsely from the dense prefix
        (docs/methods.md), the speculator on its own KV of the conversation (reuse.speculator) where it
        has one (over an H2O speculator: H2O walked from that KV); "auto" decides on the new part's length.
        logits_processors: host-side callables (ids so far, float32 logits [vocab]) -> logits, run
        before each token is chosen (core/decoding.token_chooser); not with `drafting`.
        info.kv reports the generation's cache (pass it as `reuse` to extend the conversation).
        sampling, method and drafting are a built request's parts (core/request.build_request checks how
        they combine); what needs this model and the prompt is checked and decided once, before any
        model runs, in the generation's plan (core/plan.py), which the rest only runs."""
        plan = plan_generation(
            self,
            prompt_ids,
            max_tokens=max_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            method=method,
            info=info,
            drafting=drafting,
            reuse=reuse,
            processors=logits_processors,
        )
        if max_tokens == 0:
            return iter(())
        tokens = self._generate(plan, info, progress)
        return tokens if plan.book is None else plan.book.noting_reply(tokens, max_tokens, stop_ids)

    def _generate(self, plan: GenerationPlan, info: GenerationInfo, progress: ProgressCallback | None) -> Iterator[int]:
        """Run a plan (core/plan.py): the prefill by its method, then plain or drafted decoding."""
        ids, method, reuse, speculator, draft, extra = (
            plan.ids, plan.method, plan.reuse, plan.speculator, plan.draft, plan.extra_slots
        )  # fmt: skip
        report, sparse = StageProgress(progress, info), None  # report: after every step of every stage
        with self.ops.device_scope():
            if reuse is not None and speculator is None:
                cache = self._reused_cache(reuse, len(ids) - reuse.tokens + extra)
                logits = self.prefill_prompt(
                    ids, cache, method, info, progress=report.of("prefill"), start=reuse.tokens
                )[-1]
            elif speculator is None:
                cache = self.ops.new_cache(self.model, len(ids) + extra)
                logits = self.prefill_prompt(ids, cache, method, info, progress=report.of("prefill"))[-1]
            else:
                from .methods.specprefill import speculative_prefill

                sparse = speculative_prefill(
                    self.ops,
                    self.model,
                    ids,
                    speculator[0],
                    method.specprefill or SpecPrefillConfig(),
                    stop_ids=plan.stop_ids,
                    extra_slots=extra,
                    step_size=self.prefill_step_size,
                    speculator_step_size=speculator[1],
                    report=report,
                    speculator_extra_slots=0 if draft is None else draft.speculator_room(extra),
                    reused=0 if reuse is None else reuse.tokens,
                    main_cache=None if reuse is None else (lambda room: self._reused_cache(reuse, room)),
                    speculator_cache=plan.speculator_cache,
                )
                reused = [] if reuse is None else list(range(reuse.tokens))  # the dense prefix: every token
                info.kept_positions = reused + sparse.selection.kept.tolist()
                info.kept_tokens = len(info.kept_positions)
                info.seconds.update(sparse.seconds)
                logits, cache = sparse.logits, sparse.cache
            if isinstance(cache, RecurrentCache):  # a hybrid's cache keeps its recurrent state at the prompt's end
                cache.mark()
            last = self.ops.to_numpy(logits)  # [vocab] on the host: the NaN guard, and drafting's first token
            check_logits_finite(
                bool(np.isfinite(last).all()),
                self.args,
                where="the first prefill",
                dtype=str(self.dtype).rsplit(".", 1)[-1],
            )
            if draft is None or plan.drafting is None:
                tokens = decode_tokens(
                    self.ops,
                    self.model,
                    logits,
                    next_position=len(ids),
                    max_tokens=plan.max_tokens,
                    sampling=plan.sampling,
                    stop_ids=plan.stop_ids,
                    cache=cache,
                    history=ids,
                    processors=plan.processors,
                )
            else:
                from .methods.drafting import drafted_decode

                tokens = drafted_decode(
                    self.ops,
                    self.model,
                    ids,
                    last,
                    cache,
                    draft,
                    sparse,
                    plan.drafting,
                    max_tokens=plan.max_tokens,
                    sampling=plan.sampling,
                    stop_ids=plan.stop_ids,
                    info=info,
                )
            kept_kv = reuse.speculator if reuse is not None else None  # a full prefill carries it on
            if sparse is not None:
                kept_kv = self._speculator_kv(sparse, method, reuse)
            prefix = 0 if sparse is None or reuse is None else reuse.tokens
            yield from track_kv(tokens, cache, len(ids), info, self.ops.decode_setup_seconds, prefix, kept_kv)

    def _reused_cache(self, reuse: KVState, room: int) -> Any:
        """The reused cache cut to reuse.slots on every layer (ops.Cancelled), room for `room` more (1.5x)."""
        cache = reuse.cache
        cache.truncate(reuse.slots)
        needed = reuse.slots + room
        if cache.capacity < needed:  # grow by half at least: conversations append often
            cache = cache.grown(max(needed, min(cache.capacity * 3 // 2, self.args.max_position_embeddings)))
        return cache

    @staticmethod
    def _speculator_kv(sparse: SparsePrefill, method: PrefillMethod, reuse: KVState | None) -> KVState | None:
        """The speculator's dense KV of the prompt, kept for the conversation's next SpecPrefill
        turn: after an H2O speculator pass only the dense KV it started from (its slots past that are
        H2O's, approximate); none from a hybrid speculator (its recurrent state is not kept at the
        prompt's end); after a pass that stopped short of its last layer (methods/speculator_depth.pass_depth)
        only the KV it started from, as after an H2O pass (the deeper layers hold none of the new part)."""
        cache = sparse.speculator.cache
        spec = method.specprefill
        if isinstance(cache, RecurrentCache):
            return None
        if (spec is not None and spec.speculator_prefill is not None) or not sparse.speculator.whole:
            kept = None if reuse is None else reuse.speculator
            dense = 0 if kept is None else min(kept.slots, reuse.tokens)  # the speculator's cache it started from
            return KVState(cache, dense) if dense > 0 else None
        return KVState(cache, sparse.speculator.n_prompt)

    def peak_memory_gb(self) -> float:
        """Peak device memory (or the process's peak resident set on CPU) so far, in GB (since the
        last reset_peak_memory where it could reset)."""
        return self.ops.peak_memory_gb()

    def reset_peak_memory(self) -> bool:
        """Count the peak again from now (ModelOps.reset_peak_memory); False where it cannot."""
        return self.ops.reset_peak_memory()
