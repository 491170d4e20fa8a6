"""The contract between the public API (specfill.load / generate / stream_generate) and a backend.

A backend package (specfill.backends.torch_cuda, specfill.backends.mlx) exposes
    load(path, dtype=None, device=None) -> (CausalLM, Tokenizer)
and its model implements `CausalLM`. Timing, detokenisation and response objects live in the
API layer, once for both backends.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

from .config import H2OConfig, SpecPrefillConfig
from .errors import ConfigError, PromptTooLongError, TokenizerMismatchError
from .models import ModelArgs

ProgressCallback = Callable[[int, int], None]  # (prompt tokens processed, prompt tokens total)


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy; top_p 1.0 is off; seed makes sampling repeatable."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class PrefillMethod:
    """Which prefill runs: "full", "h2o" (with h2o config) or "specprefill" (with config and a
    speculator: a loaded CausalLM or "self:K" for the main model's first K layers)."""

    name: str = "full"
    h2o: H2OConfig | None = None
    specprefill: SpecPrefillConfig | None = None
    speculator: Any = None

    def __post_init__(self) -> None:
        if self.name not in ("full", "h2o", "specprefill"):
            raise ConfigError(f"method must be full, h2o or specprefill, got {self.name!r}")


def self_speculator_layers(speculator: str, n_layers: int) -> int:
    """K of a "self:K" speculator (the main model's first K layers), checked against n_layers."""
    name, _, count = speculator.partition(":")
    if name != "self" or not count.strip().isdigit():
        raise ConfigError(f"speculator {speculator!r}: a string speculator must be 'self:K' "
                          f"(the first K of the main model's {n_layers} layers); load other models "
                          f"with specfill.load and pass the model")
    layers = int(count)
    if not 1 <= layers <= n_layers:
        raise ConfigError(f"speculator 'self:{layers}' needs 1 <= K <= {n_layers} (the main model's layers)")
    return layers


def check_speculator_vocabulary(speculator: ModelArgs, main: ModelArgs) -> None:
    """A speculator's token ids must mean what the main model's mean (the API also compares
    tokenizer fingerprints when it has both tokenizers)."""
    if speculator.vocab_size != main.vocab_size:
        raise TokenizerMismatchError(f"the speculator's vocabulary has {speculator.vocab_size} tokens, "
                                     f"the main model's {main.vocab_size}: they must share a tokenizer")


@dataclass
class KVState:
    """A generation's KV cache, kept for the next turn (the prompt cache of `specfill serve`).

    cache: the backend's own cache object (opaque outside the backend).
    slots: filled slots. With position_offset 0, slot i holds conversation token i. After
    SpecPrefill, slots 0..K-1 hold the K kept prompt tokens (at their own positions) and slot i >= K
    holds token i + position_offset.
    position_offset: RoPE position minus slot past the kept tokens (0 after full or H2O prefill;
    prompt tokens - kept tokens after SpecPrefill).
    """

    cache: Any
    slots: int
    position_offset: int = 0

    @property
    def tokens(self) -> int:
        """Conversation tokens the cache stands for (the next token's RoPE position)."""
        return self.slots + self.position_offset


def check_reuse(reuse: KVState, prompt_tokens: int, method: PrefillMethod) -> None:
    """A reused cache must stand for a proper prefix of the prompt and is extended by full prefill."""
    if method.name != "full":
        raise ConfigError(f"a reused KV cache is extended by full prefill only, got method {method.name!r}")
    if not 0 < reuse.tokens < prompt_tokens or reuse.slots < 1:
        raise ConfigError(f"a reused KV cache of {reuse.tokens} tokens must cover 1 .. {prompt_tokens - 1} of "
                          f"the {prompt_tokens} prompt tokens")


@dataclass
class PrefillInfo:
    """What a prefill did: filled in by the backend, read by the API, bench, eval and parity.

    kept_positions: SpecPrefill's kept prompt positions (ascending), None for full and H2O.
    memory_sets: H2O only and only when record_memory is set: per layer, the memory sets
    M_0 .. M_{k-2} as int arrays [Hkv, L+H] (NumPy), in chunk order.
    seconds: wall time of the prefill's parts, e.g. {"speculator": .., "main_prefill": ..}.
    kv: the generation's KV cache, set after the prefill and kept current while tokens are yielded
    (pass it as `reuse` to a later generate_step whose prompt extends this conversation).
    """

    prompt_tokens: int = 0
    kept_tokens: int = 0
    kept_positions: Sequence[int] | None = None
    record_memory: bool = False
    memory_sets: list[list[Any]] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    kv: KVState | None = None

    def start(self, prompt_tokens: int) -> None:
        """Reset what a prefill reports (an info object may be reused across calls)."""
        self.prompt_tokens = self.kept_tokens = prompt_tokens
        self.kept_positions = None
        self.memory_sets = None
        self.seconds = {}
        self.kv = None


def process_peak_memory_gb() -> float:
    """This process's peak resident set (the CPU backends' peak memory)."""
    import resource  # POSIX only: imported where it is used, so core imports everywhere

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9  # bytes vs KiB


def check_generation_fits(prompt_tokens: int, max_tokens: int, context: int) -> None:
    """max_tokens is >= 0 and the prompt plus max_tokens fit the model's context."""
    if max_tokens < 0:
        raise ConfigError(f"max_tokens must be >= 0, got {max_tokens}")
    if prompt_tokens + max_tokens > context:
        raise PromptTooLongError(f"prompt of {prompt_tokens} tokens plus max_tokens "
                                 f"{max_tokens} exceeds the model's context of {context} tokens")


def check_speculator_context(prompt_tokens: int, context: int) -> None:
    """The speculator reads the whole prompt, so it must fit the speculator's context too."""
    if prompt_tokens > context:
        raise PromptTooLongError(f"prompt of {prompt_tokens} tokens exceeds the speculator's "
                                 f"context of {context} tokens")


@runtime_checkable
class CausalLM(Protocol):
    """A loaded model on one backend."""

    backend: str  # "cuda" or "mlx"
    args: ModelArgs

    @property
    def device_name(self) -> str:
        """Where it runs, for reports: "cuda:0 (NVIDIA H100 ...)", "cpu", "gpu" (Metal)."""

    def __call__(self, ids: Any) -> Any:
        """Logits for every position, [1, T, vocab], as the backend's array type."""

    def generate_step(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingConfig,
                      stop_ids: frozenset[int], method: PrefillMethod, info: PrefillInfo,
                      progress: ProgressCallback | None = None, reuse: KVState | None = None) -> Iterator[int]:
        """Prefill `prompt_ids` with `method`, then yield generated token ids one at a time
        (the first yield marks the time to first token), stopping after a stop id or max_tokens.
        reuse: a KVState (from info.kv of an earlier generation) whose first reuse.tokens tokens
        equal prompt_ids' first ones; only the rest is prefilled (full attention, method "full"),
        into that cache (grown if needed). info.kv then reports the cache, as after any generation."""

    def prompt_logits(self, prompt_ids: Sequence[int], *, method: PrefillMethod, info: PrefillInfo) -> Any:
        """Logits [T, vocab] (float32 NumPy) for every prompt position, the prompt's attention
        computed by `method`: "full" or "h2o" (speculative prefill drops tokens: ConfigError).
        For perplexity and cross-backend parity."""

    def peak_memory_gb(self) -> float:
        """Peak device (or process) memory so far, in GB."""
