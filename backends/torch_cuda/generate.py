"""Prefill, decode and sampling on the torch Transformer (batch 1, static KV cache)."""
from __future__ import annotations

import time
from typing import Iterator

import torch

from specfill.core.runtime import ProgressCallback, SamplingConfig

from .attention import PrefillAttention, causal_attention
from .kv_cache import KVCache
from .model import Transformer

DEFAULT_PREFILL_STEP_SIZE = 2048


def wall_time(device: torch.device) -> float:
    """perf_counter after the work queued on `device` has finished (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def prefill(model: Transformer, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
            start: int = 0, step_size: int = DEFAULT_PREFILL_STEP_SIZE, logits_from: int = -1,
            attend: PrefillAttention = causal_attention,
            progress: ProgressCallback | None = None) -> torch.Tensor:
    """Run ids [T] at RoPE `positions` [T] into cache slots [start, start + T) in steps of
    `step_size` tokens.

    Returns float32 logits [T - logits_from, vocab] for the tokens from index `logits_from`
    (negative counts from the end; -1: the last token only); the LM head runs only there.
    """
    total = ids.shape[0]
    first_logit = logits_from % total if logits_from < 0 else logits_from
    logits = []
    for lo in range(0, total, step_size):
        hi = min(lo + step_size, total)
        wanted = max(first_logit - lo, 0) if hi > first_logit else None
        step_logits = model(ids[None, lo:hi], positions[lo:hi], cache, start + lo, wanted, attend)
        if step_logits is not None:
            logits.append(step_logits[0])
        if progress is not None:
            progress(hi, total)
    return torch.cat(logits)


@torch.inference_mode()
def decode_one_token(model: Transformer, token: torch.Tensor, position: int,
                     cache: KVCache) -> torch.Tensor:
    """Feed token [1] at RoPE `position` into the next free slot; float32 logits [vocab]."""
    positions = torch.tensor([position], dtype=torch.long, device=token.device)
    return model(token[None], positions, cache, cache.filled)[0, -1]


def make_generator(sampling: SamplingConfig, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def sample(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    """One token from float32 logits [vocab]: argmax at temperature 0, else temperature then
    nucleus (smallest set of tokens whose probability reaches top_p)."""
    if sampling.temperature == 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
        sorted_probs = sorted_probs.masked_fill(before >= sampling.top_p, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def decode_tokens(model: Transformer, logits: torch.Tensor, *, next_position: int, max_tokens: int,
                  sampling: SamplingConfig, stop_ids: frozenset[int], cache: KVCache) -> Iterator[int]:
    """Sample from the prefill's last logits [vocab], then decode one token at a time at RoPE
    positions next_position, next_position + 1, ... into the cache's next free slots; yields each
    token as soon as it is chosen and stops after a stop id or `max_tokens` tokens."""
    device = logits.device
    generator = make_generator(sampling, device)
    for produced in range(1, max_tokens + 1):
        token = sample(logits, sampling, generator)
        yield token
        if token in stop_ids or produced == max_tokens:
            return
        logits = decode_one_token(model, torch.tensor([token], device=device), next_position, cache)
        next_position += 1


def generate_tokens(model: Transformer, ids: torch.Tensor, *, max_tokens: int,
                    sampling: SamplingConfig, stop_ids: frozenset[int], cache: KVCache,
                    step_size: int = DEFAULT_PREFILL_STEP_SIZE,
                    progress: ProgressCallback | None = None) -> Iterator[int]:
    """Full-attention prefill of the prompt ids [P] at positions 0..P-1, then sample/decode."""
    positions = torch.arange(ids.shape[0], device=ids.device)
    logits = prefill(model, ids, positions, cache, step_size=step_size, progress=progress)[-1]
    yield from decode_tokens(model, logits, next_position=ids.shape[0], max_tokens=max_tokens,
                             sampling=sampling, stop_ids=stop_ids, cache=cache)
