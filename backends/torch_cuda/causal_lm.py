"""The torch backend's `CausalLM`: what specfill.load returns for backend="cuda"."""
from __future__ import annotations

import resource
import sys
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from specfill.core.errors import BackendUnavailableError, ConfigError, PromptTooLongError
from specfill.core.models import ModelArgs
from specfill.core.runtime import PrefillInfo, PrefillMethod, ProgressCallback, SamplingConfig

from .generate import DEFAULT_PREFILL_STEP_SIZE, generate_tokens, prefill
from .kv_cache import KVCache
from .model import Transformer
from .weights import build_transformer


class TorchCausalLM:
    """A Llama/Qwen2/Qwen3 model on a torch device (CUDA, or CPU as the fallback)."""

    backend = "cuda"

    def __init__(self, model: Transformer, *, prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE):
        if prefill_step_size < 1:
            raise ConfigError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.args: ModelArgs = model.args
        self.prefill_step_size = prefill_step_size

    @classmethod
    def from_weights(cls, args: ModelArgs, weights: Mapping[str, np.ndarray], *,
                     dtype: torch.dtype, device: torch.device | str,
                     prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE) -> "TorchCausalLM":
        return cls(build_transformer(args, weights, dtype, device),
                   prefill_step_size=prefill_step_size)

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

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

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        context = self.args.max_position_embeddings
        if prompt_tokens + max_tokens > context:
            raise PromptTooLongError(f"prompt of {prompt_tokens} tokens plus max_tokens "
                                     f"{max_tokens} exceeds the model's context of {context} tokens")

    def __call__(self, ids: Any) -> torch.Tensor:
        """Logits [1, T, vocab] (float32) for every position of `ids`, a fresh context."""
        ids = self.token_tensor(ids)
        self.check_fits(ids.shape[0], 0)
        positions = torch.arange(ids.shape[0], device=self.device)
        cache = self.new_cache(ids.shape[0])
        logits = prefill(self.model, ids, positions, cache, step_size=self.prefill_step_size,
                         logits_from=0)
        return logits[None]

    def generate_step(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingConfig,
                      stop_ids: frozenset[int], method: PrefillMethod, info: PrefillInfo,
                      progress: ProgressCallback | None = None) -> Iterator[int]:
        if method.name != "full":
            raise BackendUnavailableError(f"{method.name} prefill is not implemented on the torch "
                                          f"backend yet (use method 'full')")
        if max_tokens < 0:
            raise ConfigError(f"max_tokens must be >= 0, got {max_tokens}")
        ids = self.token_tensor(prompt_ids)
        prompt_tokens = ids.shape[0]
        self.check_fits(prompt_tokens, max_tokens)
        info.prompt_tokens = prompt_tokens
        info.kept_tokens = prompt_tokens
        info.kept_positions = None
        if max_tokens == 0:
            return iter(())
        cache = self.new_cache(prompt_tokens + max_tokens)
        return generate_tokens(self.model, ids, max_tokens=max_tokens, sampling=sampling,
                               stop_ids=stop_ids, cache=cache, step_size=self.prefill_step_size,
                               progress=progress)

    def peak_memory_gb(self) -> float:
        """Peak CUDA memory allocated by torch, or the process's peak resident set on CPU."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 1e9
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9  # bytes vs KiB
