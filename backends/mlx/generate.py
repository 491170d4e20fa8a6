"""Prefill, decode and sampling on the MLX model (batch 1).

Prefill runs in steps of `step_size` tokens, evaluating the cache after each step so the graph
stays small, and runs the LM head only on the tokens whose logits are wanted. Decode overlaps
the next step's graph evaluation with handing out the current token (mlx-lm's pattern).
"""
from __future__ import annotations

from typing import Callable, Iterator

import mlx.core as mx

from specfill.core.runtime import ProgressCallback, SamplingConfig

from .cache import KVCache
from .model import Model, PrefillAttention
from .rope import Positions

DEFAULT_PREFILL_STEP_SIZE = 2048  # mlx-lm's default too
Sampler = Callable[[mx.array], mx.array]  # log-probabilities [1, vocab] -> token [1]


def prefill(model: Model, ids: mx.array, cache: list[KVCache], *, positions: Positions = 0,
            step_size: int = DEFAULT_PREFILL_STEP_SIZE, logits_from: int = -1,
            attend: PrefillAttention | None = None, n_layers: int | None = None,
            progress: ProgressCallback | None = None) -> mx.array:
    """Append ids [T] at RoPE `positions` (first of consecutive ones, or [T]) to `cache`.

    Returns float32 logits [T - logits_from, vocab] for the tokens from index `logits_from`
    (negative counts from the end; -1: the last token only); the LM head runs only there.
    `attend` replaces causal attention (its state is evaluated with the cache after each step);
    `n_layers` runs only the model's first blocks.
    """
    total = ids.shape[0]
    first_logit = logits_from % total if logits_from < 0 else logits_from
    logits = []
    for lo in range(0, total, step_size):
        hi = min(lo + step_size, total)
        step_positions = positions[lo:hi] if isinstance(positions, mx.array) else positions + lo
        hidden = model.hidden(ids[None, lo:hi], step_positions, cache, attend, n_layers)
        state = [c.state for c in cache] + ([] if attend is None else attend.arrays())
        if hi > first_logit:
            logits.append(model.logits(hidden[:, max(first_logit - lo, 0):]).astype(mx.float32))
            state.append(logits[-1])
        mx.eval(state)
        if progress is not None:
            progress(hi, total)
    return mx.concatenate(logits, axis=1)[0]


def make_sampler(sampling: SamplingConfig) -> Sampler:
    """Greedy at temperature 0, else mlx-lm's temperature / top-p sampler."""
    if sampling.temperature == 0.0:
        return lambda logprobs: mx.argmax(logprobs, axis=-1)
    # Imported here: mlx_lm's package import pulls in transformers (seconds), greedy needs none.
    from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

    return mlx_lm_sampler(temp=sampling.temperature, top_p=sampling.top_p)


def _choose(sampler: Sampler, logits: mx.array) -> mx.array:
    """Token [1] from logits [1, vocab]; the sampler works on log-probabilities."""
    logits = logits.astype(mx.float32)
    return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


def decode_tokens(model: Model, logits: mx.array, *, next_position: int, max_tokens: int,
                  sampling: SamplingConfig, stop_ids: frozenset[int],
                  cache: list[KVCache]) -> Iterator[int]:
    """Sample from the prefill's last logits [1, vocab], then decode one token at a time at RoPE
    positions next_position, next_position + 1, ... into the cache's next free slots; yields each
    token as soon as it is chosen and stops after a stop id or `max_tokens` tokens."""
    if sampling.seed is not None:
        mx.random.seed(sampling.seed)
    sampler = make_sampler(sampling)
    token = _choose(sampler, logits)

    def decode(token: mx.array, position: int) -> mx.array:
        step_logits = model(token[None], position, cache)[:, -1, :]
        return _choose(sampler, step_logits)

    mx.eval(token)
    for produced in range(1, max_tokens + 1):
        following = None
        if produced < max_tokens:  # queue the next step before handing this token out
            following = decode(token, next_position)
            mx.async_eval(following)
            next_position += 1
        value = token.item()
        yield value
        if value in stop_ids or following is None:
            return
        token = following


def generate_tokens(model: Model, ids: mx.array, *, max_tokens: int, sampling: SamplingConfig,
                    stop_ids: frozenset[int], cache: list[KVCache],
                    step_size: int = DEFAULT_PREFILL_STEP_SIZE,
                    progress: ProgressCallback | None = None) -> Iterator[int]:
    """Full-attention prefill of the prompt ids [P] at positions 0..P-1, then sample and decode
    (see decode_tokens)."""
    logits = prefill(model, ids, cache, step_size=step_size, progress=progress)
    yield from decode_tokens(model, logits, next_position=ids.shape[0], max_tokens=max_tokens,
                             sampling=sampling, stop_ids=stop_ids, cache=cache)
