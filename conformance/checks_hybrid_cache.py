"""A hybrid model's cache (core/ops.py's KVCache with `mark` / `exact_prefix`: attention layers'
keys and values beside recurrent layers' state) on a backend's tiny random hybrid.

The NumPy reference has no recurrent layers, so the spec here is the cache's contract, checked
against the same backend's cache that never went further: a cache fed the same tokens in the same
steps up to slot s. The script: a prompt of 12 tokens in one step, its end marked, 4 more in one
step, two decode steps (points it can stand at: 0, 12, 16, 17, 18); then
  - `filled` counts the slots, `exact_prefix(s)` answers the largest point at or below s only;
  - truncate to a point (a mark, a step snapshot) and to a slot between points (the snapshot below
    it, the tokens after it replayed), trim of the last decode step, copy at the mark: the next
    tokens' logits and the recurrent arrays equal those of the cache that never went further;
  - a slot count no kept point reaches (a copy keeps its mark only) and a copy between points are
    refused with ValueError;
  - a step cancelled between layers (core/ops.py `cancellation`: some layers have read its tokens)
    is undone: exact_prefix no longer reaches it and the step run again equals an uncancelled one.
Tolerance: the dtype's (core/tolerances.py). Both sides run the same steps in the same order (the
replay runs the tokens after a snapshot as one step, and so does the reference cache), so the
values agree to the last bit on a deterministic backend; the dtype's tolerance only absorbs a
backend whose kernels pick another reduction order between calls.

A backend takes part by giving its conformance adapter `hybrid_model()` -> HybridModel; without it
(or where its hybrids are missing) the group records one skipped result saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from specfill.core.hybrid import HybridBooks
from specfill.core.ops import Cancelled, ModelOps, cancellation

from .adapter import ConformanceAdapter
from .results import Checker

STEPS = (12, 4, 1, 1)  # the script's steps; the mark follows the first (the prompt's end)
POINTS = (0, 12, 16, 17, 18)
CAPACITY = 64
NEXT = 4  # tokens run after each cut, compared


# the tiny Qwen3.5 both backends run this group on (mlx-lm's qwen3_5, transformers' qwen3_5_text,
# which share these names): 4 layers, every other one full attention
TINY_QWEN3_5 = dict(
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    vocab_size=128,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    full_attention_interval=2,
)


@dataclass
class HybridModel:
    """A backend's tiny random hybrid behind NumPy: its ops and model (ops.new_cache / forward),
    `ids` (token ids [T] int64 -> the backend's array) and `recurrent` (a cache -> its recurrent
    layers' arrays now, as float32 NumPy); `vocab` its vocabulary."""

    ops: ModelOps
    model: Any
    ids: Callable[[np.ndarray], Any]
    recurrent: Callable[[Any], list[np.ndarray]]
    vocab: int

    def step(self, cache: Any, tokens: np.ndarray, start: int) -> np.ndarray:
        logits = self.ops.forward(self.model, self.ids(tokens), start, cache, None, 0)
        return self.ops.to_numpy(logits).astype(np.float32)

    def fed(self, tokens: np.ndarray, upto: int, mark: bool = True) -> Any:
        """A cache fed tokens[:upto] in the script's steps (cut at upto), the prompt's end marked."""
        cache, start = self.ops.new_cache(self.model, CAPACITY), 0
        assert isinstance(cache, HybridBooks), f"a hybrid's cache is a HybridBooks, got {type(cache).__name__}"
        for size in STEPS:
            end = min(start + size, upto)
            if end > start:
                self.step(cache, tokens[start:end], start)
                if mark and start == 0 and end == STEPS[0]:
                    cache.mark()
            start = end
        return cache


def check_hybrid_cache(ad: ConformanceAdapter, ck: Checker) -> None:
    make = getattr(ad, "hybrid_model", None)
    hybrid = None if make is None else make()
    if hybrid is None:
        ck.skipped("hybrid_cache", "-", f"the {ad.name} backend has no hybrid models (recurrent layers) yet")
        return
    tokens = np.random.default_rng(5).integers(4, hybrid.vocab, 40).astype(np.int64)
    cache = hybrid.fed(tokens, sum(STEPS))

    def same(got: Any, slots: int, case: str, want: Any = None) -> None:
        """got (cut to `slots`) and a cache that never went further: the next tokens' logits and
        the recurrent arrays after them."""
        want = hybrid.fed(tokens, slots) if want is None else want
        ck.exact("hybrid_cache.filled", case, got.filled == slots, f"{got.filled} vs {slots}")
        ahead = tokens[slots : slots + NEXT]
        ck.close("hybrid_cache.logits", case, hybrid.step(got, ahead, slots), hybrid.step(want, ahead, slots))
        for n, (g, w) in enumerate(zip(hybrid.recurrent(got), hybrid.recurrent(want), strict=True)):
            ck.close("hybrid_cache.recurrent", f"{case},array={n}", g, w)

    ck.exact("hybrid_cache.filled", "fed 18", cache.filled == sum(STEPS), f"{cache.filled}")
    for slots in range(sum(STEPS) + 1):
        want = max(p for p in POINTS if p <= slots)
        got = cache.exact_prefix(slots)
        ck.exact("hybrid_cache.exact_prefix", f"slots={slots}", got == want, f"{got} vs {want}")
    copied = cache.copy(12, CAPACITY)  # room to run the next tokens (a torch copy holds `slots` by default)
    try:
        cache.copy(14)
        ck.exact("hybrid_cache.refusal", "copy at 14 (no point)", False, "no ValueError")
    except ValueError:
        ck.exact("hybrid_cache.refusal", "copy at 14 (no point)", True)
    cache.trim(1)
    same(cache, 17, "trim 1 (a rejected draft: the step snapshot at 17)")
    cache.truncate(14)
    same(cache, 14, "truncate to 14 (the snapshot at 12, 2 tokens replayed)")
    cache.truncate(12)
    same(cache, 12, "truncate to the mark at 12")
    same(copied, 12, "a copy at the mark")
    try:
        copied.truncate(10)  # the copy keeps its mark at 12 and the step after it only
        ck.exact("hybrid_cache.refusal", "truncate below every kept point", False, "no ValueError")
    except ValueError:
        ck.exact("hybrid_cache.refusal", "truncate below every kept point", True)
    cancelled, calls = hybrid.fed(tokens, 12), []

    def second_check() -> bool:  # stops the step at its second check
        calls.append(1)
        return len(calls) >= 2

    try:
        with cancellation(second_check):
            hybrid.step(cancelled, tokens[12:16], 12)
        ck.exact("hybrid_cache.cancelled", "a step stopped between layers", False, "the step was not stopped")
    except Cancelled:
        got = cancelled.exact_prefix(16)
        ck.exact("hybrid_cache.cancelled", "exact_prefix after the stopped step", got == 12, f"{got} vs 12")
        same(cancelled, 12, "the stopped step undone")


HYBRID_CACHE_CHECKS = {"hybrid_cache": check_hybrid_cache}
