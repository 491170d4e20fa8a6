"""The generation driver, written once: prefill by method, decode loop, stop handling, statistics.

`CausalLM` is what `specfill.load` returns on every backend: a backend model plus that backend's
`ModelOps` (core/ops.py). The methods it dispatches to live in core/methods/.
"""
from __future__ import annotations

from typing import Any, Generic, Iterator, Sequence

import numpy as np

from dataclasses import replace

from .config import H2OConfig, SpecPrefillConfig
from .crossover import auto_threshold
from .errors import ConfigError
from .methods.h2o import H2OPrefillAttention, uses_full_attention
from .methods.prefill import prefill
from .methods.specprefill import speculative_prefill
from .models import ModelArgs
from .ops import ModelOps
from .runtime import (PrefillInfo, PrefillMethod, ProgressCallback, SamplingConfig, check_generation_fits,
                      check_speculator_context, check_speculator_vocabulary, check_token_ids,
                      self_speculator_layers)
from .stages import A

DEFAULT_PREFILL_STEP_SIZE = 2048  # tokens per prefill step (mlx-lm's default too)


def decode_tokens(ops: ModelOps[A], model: Any, logits: A, *, next_position: int, max_tokens: int,
                  sampling: SamplingConfig, stop_ids: frozenset[int], cache: list[Any]) -> Iterator[int]:
    """Sample from the prefill's last logits [vocab], then decode one token at a time at RoPE
    positions next_position, next_position + 1, ... into the cache's next free slots; yields each
    token as soon as it is chosen and stops after a stop id or `max_tokens` tokens. A lazy
    backend queues step n+1 before handing out token n (mlx-lm's overlap); an eager one computes
    it after, so the first token's time is the prefill's alone."""
    choose = ops.sampler(sampling)

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


class CausalLM(Generic[A]):
    """A Llama/Qwen2/Qwen3 model on one backend: the backend's model object and its ops.

    prefill_step_size: tokens per full-attention prefill step (bounds activation memory).
    """

    def __init__(self, model: Any, ops: ModelOps[A], *, prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE):
        if prefill_step_size < 1:
            raise ConfigError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.ops = ops
        self.args: ModelArgs = model.args
        self.prefill_step_size = prefill_step_size

    @property
    def backend(self) -> str:
        return self.ops.name

    @property
    def device_name(self) -> str:
        """Where it runs, for reports: "cuda:0 (NVIDIA H100 ...)", "cpu", "gpu (Metal)"."""
        return self.ops.device_name

    @property
    def dtype(self) -> Any:
        """The activation dtype (the backend's own dtype object)."""
        return self.ops.activation_dtype(self.model)

    def _ids(self, ids: Any, max_tokens: int) -> np.ndarray:
        checked = check_token_ids(ids, self.args.vocab_size)
        check_generation_fits(len(checked), max_tokens, self.args.max_position_embeddings)
        return checked

    def __call__(self, ids: Any) -> A:
        """Logits [1, T, vocab] (float32) for every position of `ids`, a fresh context."""
        ids = self._ids(self.ops.to_numpy(ids) if not isinstance(ids, (list, tuple, np.ndarray)) else ids, 0)
        with self.ops.device_scope():
            cache = self.ops.new_cache(self.model, len(ids))
            logits = prefill(self.ops, self.model, self.ops.tokens(ids), 0, cache,
                             step_size=self.prefill_step_size, logits_from=0)
        return logits[None]

    def resolve_method(self, method: PrefillMethod, n_tokens: int) -> PrefillMethod:
        """"auto" -> full prefill below the crossover length for this backend and device (or
        method.auto_threshold), else method.sparse; other methods as they are."""
        if method.name != "auto":
            return method
        threshold = method.auto_threshold
        if threshold is None:
            threshold, _ = auto_threshold(self.backend, self.device_name, method.sparse)
        chosen = method.sparse if threshold is not None and n_tokens >= threshold else "full"
        return replace(method, name=chosen, auto_threshold=None)

    def prompt_logits(self, prompt_ids: Sequence[int], *, method: PrefillMethod, info: PrefillInfo) -> np.ndarray:
        """Logits [T, vocab] float32 NumPy for every prompt position under `method` ("full",
        "h2o" or "auto" resolving to one of them; speculative prefill drops tokens, so it has
        none). For perplexity and parity."""
        ids = self._ids(prompt_ids, 0)
        method = self.resolve_method(method, len(ids))
        if method.name == "specprefill":
            raise ConfigError("speculative prefill drops prompt tokens: it has no per-position logits")
        info.start(len(ids), method.name)
        with self.ops.device_scope():
            logits = self.prefill_prompt(ids, self.ops.new_cache(self.model, len(ids)), method, info, logits_from=0)
            return self.ops.to_numpy(logits)

    def prefill_prompt(self, ids: np.ndarray, cache: list[Any], method: PrefillMethod, info: PrefillInfo, *,
                       logits_from: int = -1, progress: ProgressCallback | None = None) -> A:
        """Full or H2O prefill of every prompt token (slots and positions 0..N-1); float32 logits
        from index `logits_from` on. Fills info.seconds["prefill"] (and the memory sets). H2O
        runs one step per logical batch; where it is plain causal attention, the full prefill."""
        started = self.ops.wall_time()
        config = method.h2o or H2OConfig()
        attend, step = None, self.prefill_step_size
        if method.name == "h2o" and not uses_full_attention(config, len(ids)):
            attend = H2OPrefillAttention(self.ops, config, self.args.num_hidden_layers, self.args.head_dim ** -0.5,
                                         len(ids))
            step = config.batch_size
        logits = prefill(self.ops, self.model, self.ops.tokens(ids), 0, cache, step_size=step,
                         logits_from=logits_from, attend=attend, progress=progress)
        if method.name == "h2o" and info.record_memory:
            info.memory_sets = (attend.memory_sets(self.ops.to_numpy) if attend is not None
                                else [[] for _ in range(self.args.num_hidden_layers)])
        info.seconds["prefill"] = self.ops.wall_time() - started
        return logits

    def speculator_model(self, speculator: Any) -> tuple[Any, int]:
        """(speculator model, its prefill step size) for PrefillMethod.speculator: a CausalLM
        loaded on this backend with this model's vocabulary, or "self:K" for this model's first
        K layers (sharing their weights)."""
        if isinstance(speculator, str):
            layers = self_speculator_layers(speculator, self.args.num_hidden_layers)
            return self.ops.first_layers(self.model, layers), self.prefill_step_size
        if not isinstance(speculator, CausalLM) or speculator.backend != self.backend:
            what = f"a model on the {speculator.backend} backend" if isinstance(speculator, CausalLM) \
                else type(speculator).__name__
            raise ConfigError(f"the speculator must be a model loaded on the {self.backend} backend or "
                              f"'self:K', got {what}")
        check_speculator_vocabulary(speculator.args, self.args)
        return speculator.model, speculator.prefill_step_size

    def generate_step(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingConfig,
                      stop_ids: frozenset[int], method: PrefillMethod, info: PrefillInfo,
                      progress: ProgressCallback | None = None) -> Iterator[int]:
        """Prefill `prompt_ids` with `method`, then yield generated token ids one at a time (the
        first yield marks the time to first token), stopping after a stop id or max_tokens."""
        ids = self._ids(prompt_ids, max_tokens)
        method = self.resolve_method(method, len(ids))
        info.start(len(ids), method.name)
        speculator = None
        if method.name == "specprefill":  # a bad speculator fails here, not at the first token
            speculator = self.speculator_model(method.speculator)
            check_speculator_context(len(ids), speculator[0].args.max_position_embeddings)
        if max_tokens == 0:
            return iter(())
        return self._generate(ids, method, speculator, max_tokens=max_tokens, sampling=sampling,
                              stop_ids=stop_ids, info=info, progress=progress)

    def _generate(self, ids: np.ndarray, method: PrefillMethod, speculator: tuple[Any, int] | None, *,
                  max_tokens: int, sampling: SamplingConfig, stop_ids: frozenset[int], info: PrefillInfo,
                  progress: ProgressCallback | None) -> Iterator[int]:
        with self.ops.device_scope():
            if speculator is None:
                cache = self.ops.new_cache(self.model, len(ids) + max_tokens)
                logits = self.prefill_prompt(ids, cache, method, info, progress=progress)[-1]
                next_position = len(ids)
            else:
                sparse = speculative_prefill(
                    self.ops, self.model, ids, speculator[0], method.specprefill or SpecPrefillConfig(),
                    stop_ids=stop_ids, extra_slots=max_tokens, step_size=self.prefill_step_size,
                    speculator_step_size=speculator[1], progress=progress)
                info.kept_positions = sparse.selection.kept.tolist()
                info.kept_tokens = len(info.kept_positions)
                info.seconds.update(sparse.seconds)
                logits, cache, next_position = sparse.logits, sparse.cache, sparse.next_position
            yield from decode_tokens(self.ops, self.model, logits, next_position=next_position,
                                     max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids, cache=cache)

    def peak_memory_gb(self) -> float:
        """Peak device memory (or the process's peak resident set on CPU) so far, in GB."""
        return self.ops.peak_memory_gb()
