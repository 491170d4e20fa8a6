"""What a generation request is made of, and its checks, for the driver and the API.

A backend (core/backend.py; specfill.backends.get_backend("mlx" / "cuda")) loads
    load(path, dtype=None, device=None) -> (core.driver.CausalLM, Tokenizer)
Timing, detokenisation and response objects live in the API layer, once for both backends.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .config import Drafting, H2OConfig, SpecPrefillConfig, setting  # noqa: F401  (Drafting: re-exported)
from .errors import ConfigError, TokenizerMismatchError
from .models import ModelArgs

ProgressCallback = Callable[[int, int], None]  # (prompt tokens processed, prompt tokens total)
MAX_SEED = 2**63 - 1  # torch and MLX take unsigned 64-bit seeds; 2**63 - 1 keeps them portable
METHODS = ("full", "h2o", "specprefill", "auto")
COMPOSED = "specprefill+h2o"  # the name of SpecPrefill whose speculator prefills with H2O (PrefillMethod.label)


def _finite(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    """`value` when it is a finite number of `kind` (never a bool), else one ConfigError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        raise _sampling_error(
            f"{name} must be {'an integer' if kind is int else 'a finite number'}, got {value!r}", name
        )
    return value


def _sampling_error(message: str, name: str) -> ConfigError:
    return ConfigError(message, name, config="SamplingConfig")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy; top_p 1.0 is off; seed makes sampling repeatable. top_k (0: off),
    min_p (0: off) and the penalties (repetition 1.0, presence 0, frequency 0: off) are defined in
    core/sampling.py, the one sampler of every setting."""

    temperature: float = setting(0.0, "sampling temperature (0: greedy)")
    top_p: float = setting(1.0, "sample from the most likely tokens holding this probability (1: off)")
    seed: int | None = setting(None, "the sampler's seed (sampling repeats with it)")
    top_k: int = setting(0, "sample from the k most likely tokens (0: off)")
    min_p: float = setting(0.0, "drop tokens less likely than min_p times the most likely (0: off)")
    repetition_penalty: float = setting(
        1.0, "divide a positive logit (multiply a negative one) of a token among the last 64 by this (1: off)"
    )
    presence_penalty: float = setting(0.0, "subtract from the logit of a token among the last 64 (0: off)")
    frequency_penalty: float = setting(
        0.0, "subtract this times its count among the last 64 from a token's logit (0: off)"
    )

    def __post_init__(self) -> None:
        """Each setting's one check: its type (a number, never a bool; top_k and seed integers) and range."""
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            _finite(name, getattr(self, name), (int, float))
            object.__setattr__(self, name, float(getattr(self, name)))
        _finite("top_k", self.top_k, int)
        if self.seed is not None and not 0 <= _finite("seed", self.seed, int) <= MAX_SEED:
            raise _sampling_error(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed!r}", "seed")
        if not self.temperature >= 0.0:
            raise _sampling_error(f"temperature must be a finite number >= 0, got {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise _sampling_error(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < 0:
            raise _sampling_error(f"top_k must be >= 0 (0: off), got {self.top_k}", "top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise _sampling_error(f"min_p must be in [0, 1] (0: off), got {self.min_p}", "min_p")
        if not self.repetition_penalty > 0.0:
            raise _sampling_error(
                f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty}", "repetition_penalty"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise _sampling_error(f"{name} must be in [-2, 2] (0: off), got {getattr(self, name)}", name)

    @property
    def clock_free(self) -> bool:
        """Whether decisions may follow measured times (drafting): a seeded sampling run must repeat."""
        return self.temperature == 0.0 or self.seed is None


@dataclass(frozen=True)
class PrefillMethod:
    """Which prefill runs: "full", "h2o" (with h2o config) or "specprefill" (with config and a
    speculator: a loaded CausalLM or "self:K" for the main model's first K layers), or "auto":
    full prefill below a crossover prompt length, above it the configured sparse method
    (`sparse`: speculative prefill when a speculator is given, else H2O). auto_threshold
    overrides the crossover calibrated on this machine (core/crossover.py)."""

    name: str = setting(
        "full",
        "the prefill method (auto: full below the crossover lengths calibrated on this "
        "machine, above them the fastest there of h2o and, with a speculator, specprefill and "
        "specprefill+h2o)",
        METHODS,
    )
    h2o: H2OConfig | None = None
    specprefill: SpecPrefillConfig | None = None
    speculator: Any = setting(
        None, "the SpecPrefill speculator: a model path, or self:K (the main model's first K layers)"
    )
    auto_threshold: int | None = setting(None, "with method auto: the prompt length from which the sparse method runs")

    def __post_init__(self) -> None:
        if self.name not in METHODS:
            raise ConfigError(
                f"method must be full, h2o, specprefill or auto, got {self.name!r}", "name", config="PrefillMethod"
            )
        if self.auto_threshold is not None and (
            isinstance(self.auto_threshold, bool) or not isinstance(self.auto_threshold, int) or self.auto_threshold < 1
        ):
            raise ConfigError(
                f"the auto threshold must be a prompt length >= 1, got {self.auto_threshold!r}",
                "auto_threshold",
                config="PrefillMethod",
            )

    @property
    def label(self) -> str:
        """The method as the statistics, GenerationResponse.method and the server's prefill_method
        name it: its name, or COMPOSED ("specprefill+h2o") when SpecPrefill's speculator prefills with H2O."""
        spec = self.specprefill
        composed = self.name == "specprefill" and spec is not None and spec.speculator_prefill is not None
        return COMPOSED if composed else self.name

    @property
    def sparse(self) -> str:
        """The sparse method "auto" switches to: specprefill with a speculator, else h2o."""
        return "specprefill" if self.speculator is not None else "h2o"


def self_speculator_layers(speculator: str, n_layers: int) -> int:
    """K of a "self:K" speculator (the main model's first K layers), checked against n_layers."""
    name, _, count = speculator.partition(":")
    if name != "self" or not count.strip().isdigit():
        raise ConfigError(
            f"speculator {speculator!r}: a string speculator must be 'self:K' "
            f"(the first K of the main model's {n_layers} layers); load other models "
            f"with specfill.load and pass the model"
        )
    layers = int(count)
    if not 1 <= layers <= n_layers:
        raise ConfigError(f"speculator 'self:{layers}' needs 1 <= K <= {n_layers} (the main model's layers)")
    return layers


def check_companion(role: str, other: ModelArgs, main: ModelArgs, other_ops: Any, main_ops: Any) -> None:
    """A speculator's or draft model's token ids must mean what the main model's mean (the API also
    compares tokenizer fingerprints when it has both tokenizers), and the main model's ops must be
    able to run it (MLX: a model mlx-lm runs needs the adapter's ops, which run own models too)."""
    if other.vocab_size != main.vocab_size:
        raise TokenizerMismatchError(
            f"the {role}'s vocabulary has {other.vocab_size} tokens, "
            f"the main model's {main.vocab_size}: they must share a tokenizer"
        )
    if not isinstance(main_ops, type(other_ops)):
        raise ConfigError(
            f"the {role} runs through {type(other_ops).__name__}, which the main model's "
            f"{type(main_ops).__name__} cannot run: load the main model as the {role} was "
            f"loaded (e.g. both through mlx-lm), or the {role} from a GGUF"
        )


class RecurrentCache(ABC):
    """A KV cache with recurrent layers beside its attention layers (a hybrid model's: core/hybrid.py's
    HybridBooks, which each backend's hybrid_cache.py subclasses). A recurrent state cannot be cut
    back to any prefix, only to the slot counts the cache kept it at, so the cache says which. A
    nominal type: a cache is recurrent because it says so (the driver, the reuse checks and the
    server's prompt cache ask by isinstance), never because it has a method of some name."""

    @abstractmethod
    def mark(self) -> None:
        """Keep the recurrent state at the current slot count (the driver calls it after each prefill)."""

    @abstractmethod
    def exact_prefix(self, slots: int) -> int:
        """The longest prefix of at most `slots` slots the cache can be cut back to exactly."""

    @abstractmethod
    def save_point(self, slots: int) -> int:
        """The slots its `save` writes for a conversation of `slots` (its latest prompt-end mark at or
        below them); ValueError when it has none."""


def exact_prefix(cache: Any, slots: int) -> int:
    """The longest prefix of at most `slots` slots `cache` can be cut back to: `slots` for a plain KV
    cache (any prefix), a RecurrentCache's own answer otherwise."""
    return cache.exact_prefix(slots) if isinstance(cache, RecurrentCache) else slots


def save_point(cache: Any, slots: int) -> int:
    """The slots `cache.save` writes for a conversation of `slots`: all of them for a plain KV cache,
    a RecurrentCache's latest prompt-end mark at or below them otherwise."""
    return cache.save_point(slots) if isinstance(cache, RecurrentCache) else slots


@dataclass
class KVState:
    """A generation's KV cache, kept for the next turn (the prompt cache of `specfill serve`).

    cache: the backend's own cache object (opaque outside the backend).
    slots: filled slots. With position_offset 0, slot i holds conversation token i. After
    SpecPrefill, slots 0..K-1 hold the K kept prompt tokens (at their own positions) and slot i >= K
    holds token i + position_offset.
    position_offset: RoPE position minus slot past the kept tokens (0 after full or H2O prefill;
    prompt tokens - kept tokens after SpecPrefill).
    prefix: after SpecPrefill from a reused prefix (docs/methods.md), the leading slots that hold
    conversation tokens 0..prefix-1 densely; the kept tokens follow them (slots prefix..prefix+K-1),
    then slot i holds token i + position_offset. 0 otherwise (plain SpecPrefill keeps no dense
    prefix; with position_offset 0 every slot is slot i = token i anyway).
    speculator: the SpecPrefill speculator's own dense KV of a prefix of the same conversation
    (slot i = token i), kept so a later SpecPrefill turn prefills only its new tokens on it; None
    when there is none.
    """

    cache: Any
    slots: int
    position_offset: int = 0
    prefix: int = 0
    speculator: KVState | None = None

    @property
    def tokens(self) -> int:
        """Conversation tokens the cache stands for (the next token's RoPE position)."""
        return self.slots + self.position_offset

    def positions(self, kept: Sequence[int] = ()) -> np.ndarray:
        """Every filled slot's RoPE position [slots] (int64): the dense prefix's, then `kept` (the
        kept tokens' original positions, GenerationInfo.kept_positions; needed when
        position_offset is not 0), then the later slots' (slot + position_offset)."""
        if self.position_offset == 0:
            return np.arange(self.slots, dtype=np.int64)
        kept = np.asarray(kept, dtype=np.int64)
        end = self.prefix + len(kept)
        if end > self.slots or (len(kept) and kept[0] < self.prefix):
            raise ValueError(f"{len(kept)} kept positions do not fit {self.slots} slots after prefix {self.prefix}")
        later = np.arange(end, self.slots, dtype=np.int64) + self.position_offset
        return np.concatenate([np.arange(self.prefix, dtype=np.int64), kept, later])


def check_drafting(drafting: "Drafting | None", method: PrefillMethod, sampling: SamplingConfig) -> None:
    """Speculative decoding's limits, checked once where a request is made (core/request.build_request;
    the driver runs a request's parts as they are): temperature, top_p and seed only yet, and no draft
    model only after speculative prefill (the speculator drafts from the prompt KV it built)."""
    if drafting is None:
        return
    if sampling != SamplingConfig(sampling.temperature, sampling.top_p, sampling.seed):
        raise ConfigError(
            "num_draft_tokens (speculative decoding) with top_k, min_p or a penalty is not supported yet",
            "num_tokens",
            config="Drafting",
        )
    if drafting.model is None and method.name != "specprefill":
        raise ConfigError(
            "num_draft_tokens without a draft model drafts with the SpecPrefill speculator: "
            "use method specprefill or give a draft model",
            "num_tokens",
            config="Drafting",
        )


@dataclass
class DecodeRecord:
    """What speculative decoding did, apart from the prefill: proposals made and accepted over the
    decode, per generated token whether it was an accepted draft, k of every round, and wall time
    {"draft_prefill" (a draft model reading the prompt), "draft", "verify"} summed over the decode,
    and "setup": preparing decode steps (capturing CUDA graphs), which decode speed leaves out."""

    drafted_tokens: int = 0
    accepted_tokens: int = 0
    from_draft: list[bool] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: str = ""  # why drafting did not run at all (a draft model's costs measured here: draft_costs.py)


@dataclass(frozen=True)
class PrefillStep:
    """The last finished prefill step (GenerationInfo.step): its stage (see methods/prefill.py's
    StageProgress) and the stage's done / total count (tokens; look-ahead tokens in "lookahead")."""

    stage: str
    done: int
    total: int


@dataclass
class GenerationInfo:
    """What one generation did (its prefill, its speculative decoding, its KV cache): filled in by
    the driver, read by the API, the server, bench, eval and parity.

    kept_positions: SpecPrefill's kept prompt positions (ascending), None for full and H2O; from a
    reused prefix, the prefix's positions (all in the KV) then the kept new ones (kept_tokens counts both).
    memory_sets: H2O only and only when record_memory is set: per layer, the memory sets
    M_0 .. M_{k-2} as int arrays [Hkv, L+H] (NumPy), in chunk order.
    seconds: wall time of the prefill's parts, e.g. {"speculator": .., "main_prefill": ..}, and
    "auto_calibration" where auto measured a calibration for this request (core/plan.py).
    method: the method that ran ("auto" resolved to full or its sparse method).
    decode: what speculative decoding did (DecodeRecord); empty without drafting.
    kv: the generation's KV cache, set after the prefill and kept current while tokens are yielded
    (pass it as `reuse` to a later generate_step whose prompt extends this conversation).
    step: the last finished prefill step (methods/prefill.py; None before the first), kept current.
    prefill_done: the share (0..1) of the time to first token's expected work done, every stage
    weighted by its expected work (methods/prefill.py StageProgress): what a progress bar shows.
    distributed: the ranks and kind of a model sharded over a group (api.stream_request), else "".
    """

    prompt_tokens: int = 0
    kept_tokens: int = 0
    kept_positions: Sequence[int] | None = None
    record_memory: bool = False
    memory_sets: list[list[Any]] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    method: str = ""
    decode: DecodeRecord = field(default_factory=DecodeRecord)
    kv: KVState | None = None
    step: PrefillStep | None = None
    prefill_done: float = 0.0
    distributed: str = ""  # "2 ranks, tensor": the model is sharded over a group of processes

    def start(self, prompt_tokens: int, method: str = "") -> None:
        """Reset what a prefill reports (an info object may be reused across calls)."""
        self.method = method
        self.prompt_tokens = self.kept_tokens = prompt_tokens
        self.kept_positions = None
        self.memory_sets = None
        self.seconds = {}
        self.decode = DecodeRecord()
        self.kv = None
        self.step = None
        self.prefill_done = 0.0
