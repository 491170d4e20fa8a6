"""The prefill step loop every method shares, written once over `ModelOps`, and how a prefill
made of stages reports its steps (`StageProgress`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..models import ModelArgs
from ..ops import ModelOps, PrefillAttention
from ..runtime import GenerationInfo, PrefillStep, ProgressCallback  # PrefillStep: re-exported
from ..stages import A

READS_PROMPT = ("prefill", "speculator")  # the stages whose steps walk through the prompt's tokens


class StageProgress:
    """Called after every step of every prefill stage: "prefill" (full or H2O: the prompt, or the
    uncached part of it), SpecPrefill's "speculator" (its pass over the prompt), "lookahead" (one
    step per fed token) and "main_prefill" (the kept tokens).

    Each step is recorded in info.step (the stage, its steps' done / total count) and reported to
    the public `progress(processed, total)` (mlx-lm's prompt_progress_callback) on the prompt's
    scale, monotone with a fixed total: a stage that walks the prompt reports its own count;
    SpecPrefill's later stages report the whole prompt read. A callback that raises stops the
    prefill there (the server cancels a request this way), so every step is a cancellation point.

    info.prefill_done is the share (0..1) of the whole time to first token's expected work done,
    what a progress bar shows: a method of several stages states their expected work (`plan`, in
    order), and each stage, when it starts, takes its work's share of what is left (so a stage that
    ends early, or a plan revised before a stage starts, never moves the share back); without a
    plan it is the prompt stage's done / total.
    """

    def __init__(self, progress: ProgressCallback | None, info: GenerationInfo | None):
        self.progress = progress
        self.info = info
        self.prompt = (0, 0)  # the last (processed, total) of a stage that reads the prompt
        self.work: dict[str, float] = {}
        self.stage, self.base, self.share, self.done = "", 0.0, 0.0, 0.0

    def plan(self, work: dict[str, float]) -> None:
        """The expected work of each stage, in the order they run (any one unit: stage_work's
        multiply-adds)."""
        self.work = dict(work)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.info is not None:
            self.info.step = PrefillStep(stage, done, total)
        if stage in READS_PROMPT:
            self.prompt = (done, total)
        if stage in self.work:
            if stage != self.stage:  # a new stage: its share of the work left
                names = list(self.work)
                left = sum(self.work[name] for name in names[names.index(stage) :])
                self.stage, self.base = stage, self.done
                self.share = (1.0 - self.base) * (self.work[stage] / left if left > 0 else 1.0)
            self.done = min(1.0, self.base + self.share * done / max(total, 1))
        else:
            self.done = done / max(total, 1)
        if self.info is not None:
            self.info.prefill_done = self.done
        if self.progress is not None:
            self.progress(*self.prompt)

    def of(self, stage: str) -> ProgressCallback:
        """The (done, total) callback of one stage's step loop (what `prefill` calls)."""
        return lambda done, total: self(stage, done, total)


def stage_work(args: Any, tokens: int, keys: float) -> float:
    """Expected multiply-adds of `tokens` tokens through a model of shape `args` (ModelArgs), each
    query attending `keys` keys on average: the layers' projections and MLP, plus attention. A
    progress weight, not a timing: a decode step costs more per token than this says (it reads the
    weights for one token), which a bar shows as a slower stretch, never as a jump back."""
    q, kv = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
    mlp = args.intermediate_size if isinstance(args, ModelArgs) else 4 * args.hidden_size  # AdaptedArgs: 4x, common
    linear = args.hidden_size * (2 * q + 2 * kv) + 3 * args.hidden_size * mlp
    return float(tokens) * args.num_hidden_layers * (linear + 2.0 * q * keys)


def step_positions(positions: int | np.ndarray, lo: int, hi: int) -> int | np.ndarray:
    """The RoPE positions of tokens [lo, hi): an int is the first of consecutive positions."""
    return positions + lo if isinstance(positions, int) else positions[lo:hi]


def prefill(
    ops: ModelOps[A],
    model: Any,
    ids: A,
    positions: int | np.ndarray,
    cache: list[Any],
    *,
    step_size: int,
    logits_from: int = -1,
    attend: PrefillAttention[A] | None = None,
    progress: ProgressCallback | None = None,
) -> A:
    """Append ids [T] at RoPE `positions` to `cache` in steps of `step_size` tokens.

    Returns float32 logits [T - logits_from, vocab] for the tokens from index `logits_from`
    (negative counts from the end; -1: the last token only); the LM head runs only there. After
    each step the cache and `attend`'s state are settled (MLX evaluates, bounding its graph), and
    `progress(done, total)` is called.
    """
    total = ids.shape[0]
    first_logit = logits_from % total if logits_from < 0 else logits_from
    logits = []
    for lo in range(0, total, step_size):
        hi = min(lo + step_size, total)
        wanted = max(first_logit - lo, 0) if hi > first_logit else None
        step_logits = ops.forward(model, ids[lo:hi], step_positions(positions, lo, hi), cache, attend, wanted)
        state: list[Any] = [cache] + ([] if attend is None else attend.arrays())
        if step_logits is not None:
            logits.append(step_logits)
            state.append(step_logits)
        ops.settle(state)
        if progress is not None:
            progress(hi, total)
    return logits[0] if len(logits) == 1 else ops.concat(logits, axis=0)
