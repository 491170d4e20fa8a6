"""The MLX backend's `CausalLM`: what specfill.load returns for backend="mlx"."""
from __future__ import annotations

import resource
import sys
from typing import Any, Iterator, Sequence

import mlx.core as mx
import numpy as np

from specfill.core.errors import BackendUnavailableError, ConfigError, PromptTooLongError
from specfill.core.models import ModelArgs
from specfill.core.runtime import PrefillInfo, PrefillMethod, ProgressCallback, SamplingConfig

from .cache import KVCache, make_cache
from .generate import DEFAULT_PREFILL_STEP_SIZE, generate_tokens, prefill
from .model import Model


class MLXCausalLM:
    """A Llama/Qwen2/Qwen3 model on an MLX device (Metal GPU on Apple silicon, else CPU)."""

    backend = "mlx"

    def __init__(self, model: Model, *, device: mx.Device, quantized: bool,
                 prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE):
        if prefill_step_size < 1:
            raise ConfigError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.args: ModelArgs = model.args
        self.device = device
        self.quantized = quantized  # some layers run quantized matmul
        self.prefill_step_size = prefill_step_size

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

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        context = self.args.max_position_embeddings
        if prompt_tokens + max_tokens > context:
            raise PromptTooLongError(f"prompt of {prompt_tokens} tokens plus max_tokens "
                                     f"{max_tokens} exceeds the model's context of {context} "
                                     f"tokens")

    def __call__(self, ids: Any) -> mx.array:
        """Logits [1, T, vocab] (float32) for every position of `ids`, a fresh context."""
        ids = self.token_array(ids)
        self.check_fits(ids.shape[0], 0)
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
        if method.name != "full":
            raise BackendUnavailableError(f"{method.name} prefill is not implemented on the MLX "
                                          f"backend yet (use method 'full')")
        logits = np.asarray(self(prompt_ids)[0])
        info.prompt_tokens = info.kept_tokens = logits.shape[0]
        return logits

    def generate_step(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingConfig,
                      stop_ids: frozenset[int], method: PrefillMethod, info: PrefillInfo,
                      progress: ProgressCallback | None = None) -> Iterator[int]:
        if method.name != "full":
            raise BackendUnavailableError(f"{method.name} prefill is not implemented on the MLX "
                                          f"backend yet (use method 'full')")
        if max_tokens < 0:
            raise ConfigError(f"max_tokens must be >= 0, got {max_tokens}")
        ids = self.token_array(prompt_ids)
        prompt_tokens = ids.shape[0]
        self.check_fits(prompt_tokens, max_tokens)
        info.prompt_tokens = prompt_tokens
        info.kept_tokens = prompt_tokens
        info.kept_positions = None
        if max_tokens == 0:
            return iter(())
        return self._generate(ids, max_tokens, sampling, stop_ids, progress)

    def _generate(self, ids: mx.array, max_tokens: int, sampling: SamplingConfig,
                  stop_ids: frozenset[int], progress: ProgressCallback | None) -> Iterator[int]:
        cache = self.new_cache(ids.shape[0] + max_tokens)
        with mx.stream(self.device):
            yield from generate_tokens(self.model, ids, max_tokens=max_tokens, sampling=sampling,
                                       stop_ids=stop_ids, cache=cache,
                                       step_size=self.prefill_step_size, progress=progress)

    def peak_memory_gb(self) -> float:
        """MLX's peak allocation on the GPU, or the process's peak resident set on CPU."""
        if self.device.type == mx.DeviceType.gpu:
            return mx.get_peak_memory() / 1e9
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9  # bytes vs KiB
