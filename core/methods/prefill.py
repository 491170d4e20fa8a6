"""The prefill step loop every method shares, written once over `ModelOps`."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ops import ModelOps, PrefillAttention
from ..runtime import ProgressCallback
from ..stages import A


def step_positions(positions: int | np.ndarray, lo: int, hi: int) -> int | np.ndarray:
    """The RoPE positions of tokens [lo, hi): an int is the first of consecutive positions."""
    return positions + lo if isinstance(positions, int) else positions[lo:hi]


def prefill(ops: ModelOps[A], model: Any, ids: A, positions: int | np.ndarray, cache: list[Any], *,
            step_size: int, logits_from: int = -1, attend: PrefillAttention[A] | None = None,
            progress: ProgressCallback | None = None) -> A:
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
