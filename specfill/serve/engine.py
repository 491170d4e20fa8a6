"""One generation, run on the worker thread: a Plan in, a stream of events out.

Events: Started (the job holds the device; its prompt-cache hit), Progress (prefill progress,
when asked for), Delta (new text), Finished (finish reason, usage, statistics). Cancellation (a
client that went away, a server shutdown) is checked inside
every prefill step, before every transformer layer (the speculator's too) and H2O chunk, through
the check `run` installs (core/ops.py `cancellation`), after every step (the progress callback raises:
core/methods/prefill.py StageProgress) and between generated tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from specfill.api import Session
from specfill.core.ops import Cancelled, cancellation
from specfill.core.runtime import GenerationInfo, PrefillMethod

from .plan import Plan
from .prompt_cache import FULL, PromptCache, Reuse
from .reply_text import hidden_token_ids
from .token_mask import ConstrainedReply, Constraints, LazyReply
from .tool_calls import held


@dataclass(frozen=True)
class Started:
    cached: int  # prompt tokens taken from the prompt cache (Anthropic's message_start reports them)


@dataclass(frozen=True)
class Progress:
    processed: int  # prompt tokens processed so far (cached ones included; monotone)
    total: int  # prompt tokens
    cached: int  # prompt tokens taken from the prompt cache
    seconds: float
    stage: str  # "prefill"; SpecPrefill: "speculator", "lookahead", "main_prefill"
    stage_processed: int  # the stage's steps so far, in tokens (look-ahead tokens in "lookahead")
    stage_total: int


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stats: dict[str, Any]
    stop: str | None = None  # the stop string that ended the text (Anthropic's stop_sequence)


@dataclass(frozen=True)
class Failed:
    status: int
    message: str


Event = Started | Progress | Delta | Finished | Failed
Emit = Callable[[Event], None]


class StopMatcher:
    """Cuts the text at the first stop string; holds back a tail that may start one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""
        self.hit: str | None = None  # the stop string found

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string was hit)."""
        self.pending += text
        found = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if found:
            at, self.hit = min(found, key=lambda f: f[0])
            out, self.pending = self.pending[:at], ""
            return out, True
        hold = held(self.pending, *self.stops)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def word(self, text: str) -> tuple[str, bool]:
        """feed() for a control token that writes no text (reply_text.py) but whose own `text` may hold a
        stop string: the stop matches there as it would in the raw text (the text held back is sent)."""
        hit = next((s for s in self.stops if s in text), None)
        if hit is None:
            return "", False
        self.hit = hit
        return self.flush(), True


class Engine:
    """The session (the loaded model and tokenizer: specfill.open), the prompt cache, and how one Plan
    is generated (session.stream)."""

    def __init__(self, session: Session, cache: PromptCache | None = None):
        self.session = session
        self.model, self.tokenizer = session.model, session.tokenizer  # the session's, for the routes
        self.cache = cache  # None: the server runs without a prompt cache
        self.constraints = Constraints(session.tokenizer)  # constrained decoding's masks (token_mask.py)
        self.hidden = hidden_token_ids(session.tokenizer)  # the ids that write no text in a reply (reply_text.py)

    @property
    def context(self) -> int:
        return self.model.args.max_position_embeddings

    def health(self) -> dict[str, Any]:
        """Extra /health fields."""
        return {
            "backend": self.model.backend,
            "device": self.model.device_name,
            "prompt_cache": None if self.cache is None else self.cache.stats(),
        }

    def has_idle_work(self) -> bool:
        """Whether a conversation's dense KV is being rebuilt, or one waits to be written to disk
        (run between requests, after the responses)."""
        return self.cache is not None and self.cache.has_idle_work()

    def idle_delay(self) -> float | None:
        """Seconds before idle_step should run (0: now; None: no idle work; prompt_cache.WRITE_AFTER_S)."""
        return None if self.cache is None else self.cache.idle_delay()

    def flush(self) -> None:
        """Write the conversations that wait for disk (a shutdown inside their quiet spell: the server's
        stop); a dense rebuild not yet done stays undone (minutes of prefill: not at a shutdown)."""
        cache = self.cache
        if cache is None:
            return
        cache.settle()  # a background write in flight: waited for
        while cache.pending() is None and cache.spec_rebuild.lagging(cache.entries) is None:
            if cache.unsaved() is None:
                return
            self.idle_step()  # one write (LeaderEngine's: on every rank)
            cache.settle()

    def idle_step(self) -> None:
        """One step of rebuilding (a few hundred tokens of full prefill), or one entry written."""
        if self.cache is not None:
            self.cache.idle_step(self.model)

    def run(self, plan: Plan, emit: Emit, layer_checks: bool = True) -> None:
        """Generate `plan`, sending events through `emit` (ends with Finished, or nothing if cancelled).
        layer_checks: also check plan.cancelled between layers and chunks inside a step (off under a
        process group, whose ranks agree on cancellation only between steps: serve/distributed.py)."""
        started = time.perf_counter()
        policy = plan.prompt_cache if self.cache is not None else "off"
        asked = plan.request.method
        rebuild_s = 0.0  # what this request waited for the earlier turn's rebuild: part of its TTFT
        if self.cache is not None and policy != "off" and asked.name != FULL.name:
            # the earlier turn's dense rebuild (and its speculator KV's, for SpecPrefill), before a sparse method
            if self.cache.finish(plan.ids, self.model, speculate=asked.speculator is not None):
                rebuild_s = time.perf_counter() - started
        reuse = self.cache.take(plan.ids, policy) if self.cache is not None else Reuse()
        # a conversation's new tokens: the asked method (auto deciding on their length) from a prefix whose
        # slot i is token i (docs/methods.md), full attention after SpecPrefill's kept slots; no drafting
        # over a reused cache yet
        from_prefix = reuse.state is not None and reuse.state.position_offset == 0
        request = plan.request
        if reuse.hit:
            request = replace(plan.request, method=asked if from_prefix else FULL, drafting=None)
        processors: tuple[ConstrainedReply | LazyReply, ...] = ()
        if plan.grammar is not None:  # a constrained reply (or lazy: its calls): chosen on the host, no drafting
            processors = (self.constraints.processor(plan.grammar),)
            request = replace(request, drafting=None)
        hidden = self.hidden if plan.skip_special_tokens else frozenset()  # the ends write no text either way
        emit(Started(reuse.cached))
        method, info = request.method, GenerationInfo()

        def progress(done: int, total: int) -> None:  # noqa: ARG001 - total: the uncached tokens
            if plan.cancelled.is_set():
                raise Cancelled
            if plan.return_progress and info.step is not None:
                emit(
                    Progress(
                        reuse.cached + done,
                        len(plan.ids),
                        reuse.cached,
                        time.perf_counter() - started,
                        info.step.stage,
                        info.step.done,
                        info.step.total,
                    )
                )

        steps = self.session.stream(
            plan.ids,
            request,
            prompt_progress_callback=progress,
            prefill_info=info,
            reuse=reuse.state,
            logits_processors=processors,
            hidden_tokens=hidden,
        )
        outcome = None
        try:
            with cancellation(plan.cancelled.is_set if layer_checks else None):  # between layers, chunks, steps
                outcome = self._stream(
                    plan,
                    steps,
                    emit,
                    lambda last: self.stats(plan, policy, method, reuse, last, info, rebuild_s),
                    hidden,
                )
        except Cancelled:
            pass
        finally:
            steps.close()
            if self.cache is not None and outcome is not None:
                self.cache.put(
                    plan.ids + outcome[0],
                    info.kv,
                    prompt_tokens=len(plan.ids),
                    method=(info.method or method.name).split("+")[
                        0
                    ],  # what ran: auto resolved, the composition's base
                    reuse=reuse,
                    policy=policy,
                )
            elif self.cache is not None:  # cancelled or failed: the reused prefix is still intact
                self.cache.restore(plan.ids, reuse)
        if outcome is not None:  # only now: the client's next turn must find this one in the cache
            emit(outcome[1])

    def _stream(
        self,
        plan: Plan,
        steps: Iterator[Any],
        emit: Emit,
        stats: Callable[[Any], dict[str, Any]],
        hidden: frozenset[int] = frozenset(),
    ) -> tuple[list[int], Finished] | None:
        """Send the text (`hidden`: the control tokens whose text the steps left out, reply_text.py; cut at
        stop strings); (the generated ids, the Finished event to send), or None when cancelled or nothing
        was generated."""
        matcher = StopMatcher(plan.stops)
        last, finish, generated = None, "length", []
        for last in steps:
            if plan.cancelled.is_set():
                return None
            generated.append(last.token)
            if last.token in hidden and not last.finish_reason:  # no text, but a stop string may be its own
                text, hit = matcher.word(self.tokenizer.token_text(last.token) or "")
            else:
                text, hit = matcher.feed(last.text)
            if text:
                emit(Delta(text))
            if hit:
                finish = "stop"
                break
            if last.finish_reason:
                finish = last.finish_reason
        tail = matcher.flush()  # empty after a stop string: what followed it is dropped
        if tail:
            emit(Delta(tail))
        if last is None:
            return None
        numbers = stats(last)
        return generated, Finished(
            finish, len(plan.ids), last.generation_tokens, numbers["cached_tokens"], numbers, stop=matcher.hit
        )

    @staticmethod
    def stats(
        plan: Plan,
        policy: str,
        method: PrefillMethod,
        reuse: Reuse,
        last: Any,
        info: GenerationInfo,
        rebuild_s: float = 0.0,
    ) -> dict[str, Any]:
        """What the final chunk reports beside usage: method, TTFT, kept and cached tokens, speeds.
        prefill_method names the method that ran ("auto" resolved, as GenerationInfo.method has it).
        rebuild_s: the earlier turn's dense rebuild this request finished before its prefill (the
        exact policy, when the client came back before idle time finished it): counted in ttft_s,
        as the client waited for it, and named apart in prefill_seconds ("rebuild")."""
        parts = {**info.seconds, **info.decode.seconds, **({"rebuild": rebuild_s} if rebuild_s else {})}
        return {
            "method": plan.method_name,
            "prefill_method": info.method or method.name,
            "prompt_cache": policy,
            "prompt_tokens": last.prompt_tokens,
            "cached_tokens": reuse.cached,
            "kept_tokens": last.kept_tokens,
            "ttft_s": round(rebuild_s + last.ttft, 6),
            "prompt_tps": round(last.prompt_tps, 3),
            "generation_tokens": last.generation_tokens,
            "generation_tps": round(last.generation_tps, 3),
            "peak_memory_gb": round(last.peak_memory, 4),
            "queue_s": round(plan.queue_seconds, 6),
            "drafted_tokens": last.drafted_tokens,
            "accepted_tokens": last.accepted_tokens,
            "draft_skipped": last.draft_skipped,
            # the field has always carried drafting's draft_prefill / draft / verify seconds too
            "prefill_seconds": {k: round(v, 6) for k, v in parts.items()},
            "notes": plan.notes,
        }
