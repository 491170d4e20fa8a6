"""The torch backend's `CausalLM`: what specfill.load returns for backend="cuda"."""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import ConfigError
from specfill.core.models import ModelArgs
from specfill.core.runtime import (KVState, PrefillInfo, PrefillMethod, ProgressCallback, SamplingConfig,
                                   check_generation_fits, check_reuse, check_speculator_context,
                                   check_speculator_vocabulary, process_peak_memory_gb,
                                   self_speculator_layers)

from .generate import DEFAULT_PREFILL_STEP_SIZE, decode_tokens, prefill, wall_time
from .h2o_prefill import h2o_prefill
from .kv_cache import KVCache
from .model import Transformer
from .speculative import speculative_prefill
from .weights import build_transformer


class TorchCausalLM:
    """A Llama/Qwen2/Qwen3 model on a torch device (CUDA, or CPU as the fallback).

    use_kernels picks the H2O / speculator-scoring stage implementation: None = the Triton
    kernels on CUDA and the torch twins elsewhere; True / False force one.
    """

    backend = "cuda"

    def __init__(self, model: Transformer, *, prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
                 use_kernels: bool | None = None):
        if prefill_step_size < 1:
            raise ConfigError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.args: ModelArgs = model.args
        self.prefill_step_size = prefill_step_size
        self.use_kernels = use_kernels

    @classmethod
    def from_weights(cls, args: ModelArgs, weights: Mapping[str, np.ndarray], *,
                     dtype: torch.dtype, device: torch.device | str,
                     prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
                     use_kernels: bool | None = None) -> "TorchCausalLM":
        return cls(build_transformer(args, weights, dtype, device), prefill_step_size=prefill_step_size,
                   use_kernels=use_kernels)

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    @property
    def device_name(self) -> str:
        device = self.device
        return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed.weight.dtype

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache.allocate(self.args, capacity, self.dtype, self.device)

    def token_tensor(self, ids: Any) -> torch.Tensor:
        """ids (a sequence of ints, or a LongTensor [T] or [1, T]) as a LongTensor [T] on the
        model's device, checked against the vocabulary."""
        ids = torch.as_tensor(ids if isinstance(ids, torch.Tensor) else list(ids),
                              device=self.device)
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.numel() == 0:
            raise ConfigError(f"token ids must be a non-empty sequence (batch 1), got shape "
                              f"{tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ConfigError(f"token ids must be integers, got {ids.dtype}")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.args.vocab_size:
            bad = low if low < 0 else high
            raise ConfigError(f"token id {bad} is outside the vocabulary "
                              f"(size {self.args.vocab_size})")
        return ids.long()

    def __call__(self, ids: Any) -> torch.Tensor:
        """Logits [1, T, vocab] (float32) for every position of `ids`, a fresh context."""
        ids = self.token_tensor(ids)
        check_generation_fits(ids.shape[0], 0, self.args.max_position_embeddings)
        positions = torch.arange(ids.shape[0], device=self.device)
        cache = self.new_cache(ids.shape[0])
        logits = prefill(self.model, ids, positions, cache, step_size=self.prefill_step_size,
                         logits_from=0)
        return logits[None]

    def prompt_logits(self, prompt_ids: Sequence[int], *, method: PrefillMethod,
                      info: PrefillInfo) -> np.ndarray:
        """Logits [T, vocab] float32 NumPy for every prompt position under `method`."""
        if method.name == "specprefill":
            raise ConfigError("speculative prefill drops prompt tokens: it has no per-position logits")
        ids = self.token_tensor(prompt_ids)
        check_generation_fits(ids.shape[0], 0, self.args.max_position_embeddings)
        info.start(ids.shape[0])
        logits = self.prefill_prompt(ids, self.new_cache(ids.shape[0]), method, info, logits_from=0)
        return logits.float().cpu().numpy()

    def prefill_prompt(self, ids: torch.Tensor, cache: KVCache, method: PrefillMethod, info: PrefillInfo, *,
                       logits_from: int = -1, progress: ProgressCallback | None = None) -> torch.Tensor:
        """Full or H2O prefill of every prompt token (slots and positions 0..N-1); float32 logits
        from index `logits_from` on. Fills info.seconds["prefill"] (and the memory sets)."""
        started = wall_time(ids.device)
        if method.name == "h2o":
            logits, memory_sets = h2o_prefill(self.model, ids, cache, method.h2o or H2OConfig(),
                                              logits_from=logits_from, step_size=self.prefill_step_size,
                                              use_kernels=self.use_kernels, progress=progress)
            if info.record_memory:
                info.memory_sets = memory_sets
        else:
            logits = prefill(self.model, ids, torch.arange(ids.shape[0], device=ids.device), cache,
                             step_size=self.prefill_step_size, logits_from=logits_from, progress=progress)
        info.seconds["prefill"] = wall_time(ids.device) - started
        return logits

    def speculator_model(self, speculator: Any) -> tuple[Transformer, int]:
        """(speculator Transformer, its prefill step size) for PrefillMethod.speculator: a loaded
        TorchCausalLM with this model's vocabulary, or "self:K" for this model's first K layers."""
        if isinstance(speculator, str):
            layers = self_speculator_layers(speculator, self.args.num_hidden_layers)
            return self.model.first_layers(layers), self.prefill_step_size
        if not isinstance(speculator, TorchCausalLM):
            raise ConfigError(f"the speculator must be a model loaded on the torch backend or 'self:K', "
                              f"got {type(speculator).__name__}")
        check_speculator_vocabulary(speculator.args, self.args)
        return speculator.model, speculator.prefill_step_size

    def generate_step(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingConfig,
                      stop_ids: frozenset[int], method: PrefillMethod, info: PrefillInfo,
                      progress: ProgressCallback | None = None, reuse: KVState | None = None) -> Iterator[int]:
        ids = self.token_tensor(prompt_ids)
        prompt_tokens = ids.shape[0]
        check_generation_fits(prompt_tokens, max_tokens, self.args.max_position_embeddings)
        info.start(prompt_tokens)
        if reuse is not None:
            check_reuse(reuse, prompt_tokens, method)
        if method.name == "specprefill":  # a bad speculator fails here, not at the first token
            speculator = self.speculator_model(method.speculator)
            check_speculator_context(prompt_tokens, speculator[0].args.max_position_embeddings)
        if max_tokens == 0:
            return iter(())
        if reuse is not None:
            return self._generate_reused(ids, reuse, max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids,
                                         info=info, progress=progress)
        if method.name == "specprefill":
            return self._generate_sparse(ids, speculator, method.specprefill or SpecPrefillConfig(),
                                         max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids,
                                         info=info, progress=progress)
        return self._generate_dense(ids, method, max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids,
                                    info=info, progress=progress)

    def _generate_dense(self, ids: torch.Tensor, method: PrefillMethod, *, max_tokens: int,
                        sampling: SamplingConfig, stop_ids: frozenset[int], info: PrefillInfo,
                        progress: ProgressCallback | None) -> Iterator[int]:
        cache = self.new_cache(ids.shape[0] + max_tokens)
        logits = self.prefill_prompt(ids, cache, method, info, progress=progress)[-1]
        yield from _tracked(decode_tokens(self.model, logits, next_position=ids.shape[0], max_tokens=max_tokens,
                                          sampling=sampling, stop_ids=stop_ids, cache=cache), cache, 0, info)

    def _generate_reused(self, ids: torch.Tensor, reuse: KVState, *, max_tokens: int, sampling: SamplingConfig,
                         stop_ids: frozenset[int], info: PrefillInfo,
                         progress: ProgressCallback | None) -> Iterator[int]:
        """Full prefill of ids[reuse.tokens:] after the reused cache's slots, then decode (prompt-cache hook)."""
        first, new = reuse.tokens, ids.shape[0] - reuse.tokens
        cache = reuse.cache
        needed = reuse.slots + new + max_tokens
        if cache.capacity < needed:  # grow by half at least (up to the context): turns append often
            grown = self.new_cache(max(needed, min(cache.capacity * 3 // 2, self.args.max_position_embeddings)))
            grown.k[:, :, :, :reuse.slots] = cache.k[:, :, :, :reuse.slots]
            grown.v[:, :, :, :reuse.slots] = cache.v[:, :, :, :reuse.slots]
            cache = grown
        started = wall_time(ids.device)
        logits = prefill(self.model, ids[first:], torch.arange(first, ids.shape[0], device=ids.device), cache,
                         start=reuse.slots, step_size=self.prefill_step_size, progress=progress)[-1]
        info.seconds["prefill"] = wall_time(ids.device) - started
        yield from _tracked(decode_tokens(self.model, logits, next_position=ids.shape[0], max_tokens=max_tokens,
                                          sampling=sampling, stop_ids=stop_ids, cache=cache),
                            cache, reuse.position_offset, info)

    def _generate_sparse(self, ids: torch.Tensor, speculator: tuple[Transformer, int], config: SpecPrefillConfig,
                         *, max_tokens: int, sampling: SamplingConfig, stop_ids: frozenset[int],
                         info: PrefillInfo, progress: ProgressCallback | None) -> Iterator[int]:
        spec_model, spec_step = speculator
        sparse = speculative_prefill(self.model, ids, spec_model, config, stop_ids=stop_ids,
                                     extra_slots=max_tokens, step_size=self.prefill_step_size,
                                     speculator_step_size=spec_step, use_kernels=self.use_kernels,
                                     progress=progress)
        info.kept_positions = sparse.selection.kept.tolist()
        info.kept_tokens = len(info.kept_positions)
        info.seconds.update(sparse.seconds)
        yield from _tracked(decode_tokens(self.model, sparse.logits, next_position=sparse.next_position,
                                          max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids,
                                          cache=sparse.cache),
                            sparse.cache, sparse.next_position - sparse.cache.filled, info)

    def peak_memory_gb(self) -> float:
        """Peak CUDA memory allocated by torch, or the process's peak resident set on CPU."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 1e9
        return process_peak_memory_gb()



def _tracked(tokens: Iterator[int], cache: KVCache, position_offset: int, info: PrefillInfo) -> Iterator[int]:
    """Yield the tokens, keeping info.kv on the cache's filled slots (prompt-cache hook)."""
    info.kv = KVState(cache, cache.filled, position_offset)
    for token in tokens:
        info.kv.slots = cache.filled
        yield token
