"""The decode loops' shared pieces: plain decoding one token at a time, and the KV-state tracking
that lets a later turn reuse a generation's cache (the prompt cache of `specfill serve`)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .ops import KVCache, ModelOps
from .runtime import GenerationInfo, KVState, SamplingConfig
from .sampling import greedy, make_sampler
from .stages import A

LogitsProcessor = Callable[[Sequence[int], np.ndarray], np.ndarray]  # (ids so far, logits [vocab]) -> logits


def token_chooser(
    ops: ModelOps[A], sampling: SamplingConfig, history: Sequence[int], processors: Sequence[LogitsProcessor] = ()
) -> Callable[[A], A]:
    """float32 logits [vocab] -> the chosen token as a backend int array [1]: core/sampling.py's
    sampler on a host copy, after the logits processors (mlx-lm's `logits_processors`, on the host:
    each gets the prompt's ids and those chosen so far, and the float32 logits [vocab], and returns
    logits; the server's constrained decoding, specfill/serve/token_mask.py, is one). Plain greedy
    decoding without processors takes the device's argmax, the same token without a host copy (a
    lazy backend then queues step n + 1 on the token still being computed)."""
    if greedy(sampling) and not processors:
        return ops.argmax
    sampler = make_sampler(sampling, history)
    ids = list(history)

    def choose(logits: A) -> A:
        scores = ops.to_numpy(logits)
        for processor in processors:
            scores = processor(ids, scores)
        ids.append(sampler(scores))
        return ops.tokens(np.array(ids[-1:], dtype=np.int64))

    return choose


def decode_tokens(
    ops: ModelOps[A],
    model: Any,
    logits: A,
    *,
    next_position: int,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_ids: frozenset[int],
    cache: KVCache[A],
    history: Sequence[int] = (),
    processors: Sequence[LogitsProcessor] = (),
) -> Iterator[int]:
    """Sample from the prefill's last logits [vocab], then decode one token at a time at RoPE
    positions next_position, next_position + 1, ... into the cache's next free slots; yields each
    token as soon as it is chosen and stops after a stop id or `max_tokens` tokens. A lazy
    backend queues step n+1 before handing out token n (mlx-lm's overlap); an eager one computes
    it after, so the first token's time is the prefill's alone. history: the prompt's ids (the
    penalties' window, core/sampling.py); processors: logits processors (token_chooser)."""
    choose = token_chooser(ops, sampling, history, processors)

    def step(token: A, position: int) -> A:
        return choose(ops.forward(model, token, position, cache, None, 0)[-1])

    token = choose(logits)
    for produced in range(1, max_tokens + 1):
        following = None
        if ops.lazy and produced < max_tokens:
            following = step(token, next_position)
            ops.schedule([following])  # evaluated while token n is handed out
            next_position += 1
        value = ops.item(token)
        yield value
        if value in stop_ids or produced == max_tokens:
            return
        if following is None:
            following = step(token, next_position)
            next_position += 1
        token = following


def track_kv(
    tokens: Iterator[int],
    cache: KVCache,
    next_position: int,
    info: GenerationInfo,
    setup_seconds: Callable[[], float] | None = None,
    prefix: int = 0,
    speculator: KVState | None = None,
) -> Iterator[int]:
    """Yield `tokens`, keeping info.kv on the cache's filled slots. position_offset = RoPE position
    minus slot: 0 after full or H2O prefill, prompt tokens - kept tokens after SpecPrefill.
    prefix, speculator: KVState's (SpecPrefill from a reused prefix's dense prefix; the speculator's KV).
    setup_seconds: the backend's clock of decode-step preparation (ModelOps.decode_setup_seconds);
    what it adds during this decode is kept in info.decode.seconds["setup"], apart from decode speed."""
    info.kv = KVState(cache, cache.filled, next_position - cache.filled, prefix, speculator)
    base = setup_seconds() if setup_seconds is not None else 0.0
    for token in tokens:
        info.kv.slots = cache.filled
        if setup_seconds is not None:
            spent = setup_seconds() - base
            if spent:
                info.decode.seconds["setup"] = spent
        yield token
