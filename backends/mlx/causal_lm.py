"""The MLX backend's `CausalLM`: what specfill.load returns for backend="mlx"."""
from __future__ import annotations

import time
from typing import Any, Iterator, Sequence

import mlx.core as mx
import numpy as np

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import ConfigError
from specfill.core.models import ModelArgs
from specfill.core.runtime import (KVState, PrefillInfo, PrefillMethod, ProgressCallback, SamplingConfig,
                                   check_generation_fits, check_reuse, check_speculator_context,
                                   check_speculator_vocabulary, process_peak_memory_gb,
                                   self_speculator_layers)

from .cache import KVCache, make_cache
from .generate import DEFAULT_PREFILL_STEP_SIZE, decode_tokens, prefill
from .h2o_prefill import h2o_prefill
from .model import Model
from .speculative import Speculator, speculative_prefill


class MLXCausalLM:
    """A Llama/Qwen2/Qwen3 model on an MLX device (Metal GPU on Apple silicon, else CPU).

    use_kernels picks the H2O / speculator-scoring stage implementation: None = the Metal
    kernels where Metal exists and the MLX-ops twins elsewhere; True / False force one.
    """

    backend = "mlx"

    def __init__(self, model: Model, *, device: mx.Device, quantized: bool,
                 prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
                 use_kernels: bool | None = None):
        if prefill_step_size < 1:
            raise ConfigError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.args: ModelArgs = model.args
        self.device = device
        self.quantized = quantized  # some layers run quantized matmul
        self.prefill_step_size = prefill_step_size
        self.use_kernels = use_kernels

    @property
    def device_name(self) -> str:
        return "gpu (Metal)" if self.device.type == mx.DeviceType.gpu else "cpu"

    @property
    def dtype(self) -> mx.Dtype:
        """The activation dtype (the final norm's weight dtype)."""
        return self.model.model.norm.weight.dtype

    def new_cache(self, capacity: int) -> list[KVCache]:
        return make_cache(self.args, capacity)

    def token_array(self, ids: Any) -> mx.array:
        """ids (a sequence of ints, or an array [T] or [1, T]) as int32 [T], checked against the
        vocabulary."""
        ids = np.asarray(ids if isinstance(ids, (np.ndarray, mx.array)) else list(ids))
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1 or ids.size == 0:
            raise ConfigError(f"token ids must be a non-empty sequence (batch 1), got shape "
                              f"{tuple(ids.shape)}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ConfigError(f"token ids must be integers, got {ids.dtype}")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.args.vocab_size:
            bad = low if low < 0 else high
            raise ConfigError(f"token id {bad} is outside the vocabulary "
                              f"(size {self.args.vocab_size})")
        return mx.array(ids.astype(np.int32))

    def __call__(self, ids: Any) -> mx.array:
        """Logits [1, T, vocab] (float32) for every position of `ids`, a fresh context."""
        ids = self.token_array(ids)
        check_generation_fits(ids.shape[0], 0, self.args.max_position_embeddings)
        with mx.stream(self.device):
            logits = prefill(self.model, ids, self.new_cache(ids.shape[0]),
                             step_size=self.prefill_step_size, logits_from=0)
        return logits[None]

    def prompt_logits(self, prompt_ids: Sequence[int], *, method: PrefillMethod,
                      info: PrefillInfo) -> np.ndarray:
        """Logits [T, vocab] float32 NumPy for every prompt position under `method`."""
        if method.name == "specprefill":
            raise ConfigError("speculative prefill drops prompt tokens: it has no per-position "
                              "logits")
        ids = self.token_array(prompt_ids)
        check_generation_fits(ids.shape[0], 0, self.args.max_position_embeddings)
        info.start(ids.shape[0])
        with mx.stream(self.device):
            logits = self.prefill_prompt(ids, self.new_cache(ids.shape[0]), method, info,
                                         logits_from=0)
        return np.asarray(logits)

    def prefill_prompt(self, ids: mx.array, cache: list[KVCache], method: PrefillMethod,
                       info: PrefillInfo, *, logits_from: int = -1,
                       progress: ProgressCallback | None = None) -> mx.array:
        """Full or H2O prefill of every prompt token (slots and positions 0..N-1); float32 logits
        from index `logits_from` on. Fills info.seconds["prefill"] (and the memory sets)."""
        started = time.perf_counter()
        if method.name == "h2o":
            logits, memory_sets = h2o_prefill(self.model, ids, cache, method.h2o or H2OConfig(),
                                              logits_from=logits_from,
                                              step_size=self.prefill_step_size,
                                              use_kernels=self.use_kernels, progress=progress)
            if info.record_memory:
                info.memory_sets = memory_sets
        else:
            logits = prefill(self.model, ids, cache, step_size=self.prefill_step_size,
                             logits_from=logits_from, progress=progress)
        info.seconds["prefill"] = time.perf_counter() - started
        return logits

    def speculator_model(self, speculator: Any) -> Speculator:
        """The Speculator for PrefillMethod.speculator: a loaded MLXCausalLM with this model's
        vocabulary, or "self:K" for this model's first K layers."""
        if isinstance(speculator, str):
            layers = self_speculator_layers(speculator, self.args.num_hidden_layers)
            return Speculator(self.model, layers, self.prefill_step_size)
        if not isinstance(speculator, MLXCausalLM):
            raise ConfigError(f"the speculator must be a model loaded on the MLX backend or "
                              f"'self:K', got {type(speculator).__name__}")
        check_speculator_vocabulary(speculator.args, self.args)
        return Speculator(speculator.model, speculator.args.num_hidden_layers,
                          speculator.prefill_step_size)

    def generate_step(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingConfig,
                      stop_ids: frozenset[int], method: PrefillMethod, info: PrefillInfo,
                      progress: ProgressCallback | None = None, reuse: KVState | None = None) -> Iterator[int]:
        ids = self.token_array(prompt_ids)
        prompt_tokens = ids.shape[0]
        check_generation_fits(prompt_tokens, max_tokens, self.args.max_position_embeddings)
        info.start(prompt_tokens)
        if reuse is not None:
            check_reuse(reuse, prompt_tokens, method)
        if method.name == "specprefill":  # a bad speculator fails here, not at the first token
            speculator = self.speculator_model(method.speculator)
            check_speculator_context(prompt_tokens, speculator.context)
        if max_tokens == 0:
            return iter(())
        if reuse is not None:
            return self._generate_reused(ids, reuse, max_tokens=max_tokens, sampling=sampling,
                                         stop_ids=stop_ids, info=info, progress=progress)
        if method.name == "specprefill":
            return self._generate_sparse(ids, speculator, method.specprefill or SpecPrefillConfig(),
                                         max_tokens=max_tokens, sampling=sampling,
                                         stop_ids=stop_ids, info=info, progress=progress)
        return self._generate_dense(ids, method, max_tokens=max_tokens, sampling=sampling,
                                    stop_ids=stop_ids, info=info, progress=progress)

    def _generate_dense(self, ids: mx.array, method: PrefillMethod, *, max_tokens: int,
                        sampling: SamplingConfig, stop_ids: frozenset[int], info: PrefillInfo,
                        progress: ProgressCallback | None) -> Iterator[int]:
        cache = self.new_cache(ids.shape[0] + max_tokens)
        with mx.stream(self.device):
            logits = self.prefill_prompt(ids, cache, method, info, progress=progress)
            yield from _tracked(decode_tokens(self.model, logits, next_position=ids.shape[0],
                                              max_tokens=max_tokens, sampling=sampling,
                                              stop_ids=stop_ids, cache=cache), cache, 0, info)

    def _generate_reused(self, ids: mx.array, reuse: KVState, *, max_tokens: int,
                         sampling: SamplingConfig, stop_ids: frozenset[int], info: PrefillInfo,
                         progress: ProgressCallback | None) -> Iterator[int]:
        """Full prefill of ids[reuse.tokens:] after the reused cache's slots, then decode
        (prompt-cache hook)."""
        first = reuse.tokens
        needed = reuse.slots + ids.shape[0] - first + max_tokens
        cache = reuse.cache
        for layer in cache:  # drop slots past the reused ones; grow by half at least when short
            layer.offset = reuse.slots
            if layer.capacity < needed:
                layer.max_size = max(needed, min(layer.capacity * 3 // 2, self.args.max_position_embeddings))
        started = time.perf_counter()
        with mx.stream(self.device):
            logits = prefill(self.model, ids[first:], cache, positions=first,
                             step_size=self.prefill_step_size, progress=progress)
            info.seconds["prefill"] = time.perf_counter() - started
            yield from _tracked(decode_tokens(self.model, logits, next_position=ids.shape[0],
                                              max_tokens=max_tokens, sampling=sampling,
                                              stop_ids=stop_ids, cache=cache),
                                cache, reuse.position_offset, info)

    def _generate_sparse(self, ids: mx.array, speculator: Speculator, config: SpecPrefillConfig, *,
                         max_tokens: int, sampling: SamplingConfig, stop_ids: frozenset[int],
                         info: PrefillInfo, progress: ProgressCallback | None) -> Iterator[int]:
        with mx.stream(self.device):
            sparse = speculative_prefill(self.model, ids, speculator, config, stop_ids=stop_ids,
                                         extra_slots=max_tokens, step_size=self.prefill_step_size,
                                         use_kernels=self.use_kernels, progress=progress)
            info.kept_positions = np.asarray(sparse.selection.kept).tolist()
            info.kept_tokens = len(info.kept_positions)
            info.seconds.update(sparse.seconds)
            yield from _tracked(decode_tokens(self.model, sparse.logits,
                                              next_position=sparse.next_position,
                                              max_tokens=max_tokens, sampling=sampling,
                                              stop_ids=stop_ids, cache=sparse.cache),
                                sparse.cache, sparse.next_position - sparse.cache[0].offset, info)

    def peak_memory_gb(self) -> float:
        """MLX's peak allocation on the GPU, or the process's peak resident set on CPU."""
        if self.device.type == mx.DeviceType.gpu:
            return mx.get_peak_memory() / 1e9
        return process_peak_memory_gb()



def _tracked(tokens: Iterator[int], cache: list[KVCache], position_offset: int,
             info: PrefillInfo) -> Iterator[int]:
    """Yield the tokens, keeping info.kv on the cache's filled slots (prompt-cache hook)."""
    info.kv = KVState(cache, cache[0].offset, position_offset)
    for token in tokens:
        info.kv.slots = cache[0].offset
        yield token
