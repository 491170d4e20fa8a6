"""Method configurations, validated once at construction.

Defaults follow the design documents: H2O from seed 001's recommended configuration (-b 4096 -ub 1024
--h2o-local 256 --h2o-heavy 256; B 16384: it only schedules) plus a measured dense tail of 64 tokens, speculative
prefill from the reference implementation (look-ahead 8, pool kernel 13, chunks of 32, max over heads and layers)
but keeping 30% of the prompt, not the paper's 10%: at 10% the Qwen2.5-Coder pair lost a third of its RULER
answers (variable tracking 47 vs 87), at 30% it is within 3.5 points of full prefill on average (issue 34;
results/eval/ruler/frontier/, docs/eval.md). `SpecPrefillConfig.paper()` is the paper's setting.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any

from .config_checks import (
    SELECT_UNITS,
    _check_deep_keep,
    _check_keep_rule,
    _check_spans,
    _check_units,
    _error,
    _require_int,
    _require_share,
)
from .errors import ConfigError, SpecfillWarning

REDUCTIONS = ("max", "mean")
DEFAULT_KEEP_RATIO = 0.3  # measured (issue 34): the paper's 0.1 loses multi-hop answers
PAPER_KEEP_RATIO = 0.1  # the reference implementation's keep share
MASS_FLOOR, MASS_CEILING = 0.05, 0.5  # the mass rule's chunk-share bounds when none are given
DEEP_WINDOW = 64  # deep_keep: the prompt's last queries of the layers before the deeper ones, ranking the share
GROWTH_FROM = 4096  # keep_growth's default growth_from: the prompt length (tokens) up to which the keep ratio holds
# H2O runs in the first third of the layers and the rest attend to every key: with H2O in every
# layer (seed 001, layers="all") the answer tokens' keys and values in the later layers drift and
# multi-value needles lose a value (issue 34: research/h2o_fidelity)
DEFAULT_H2O_LAYERS = "first-0.33"


KEEP_RULES = ("keep_ratio", "keep_tokens", "keep_mass")  # SpecPrefill's keep rule: at most one is set
SPECULATOR_PREFILLS = ("h2o", "dense")  # SpecPrefillConfig.speculator_prefill's public values


def layer_subset(spec: str, n_layers: int) -> list[int]:
    """Layers named by a spec: "all"; "first-K" / "last-K" (K >= 1 layers, at most all); or
    "first-F" / "last-F" with F in (0, 1) (round(F * n_layers), at least one)."""
    text = str(spec).strip().lower()
    if text == "all":
        return list(range(n_layers))
    side, _, count = text.partition("-")
    k = 0
    if side in ("first", "last"):
        try:
            if count.isdigit():
                k = int(count)
            elif 0.0 < float(count) < 1.0:
                k = max(1, round(float(count) * n_layers))
        except ValueError:
            pass
    if k < 1:
        raise ConfigError(
            f"layers must be 'all', 'first-K' / 'last-K' with K >= 1 or 'first-F' / 'last-F' with F in "
            f"(0, 1), got {spec!r}",
            "layers",
        )
    k = min(k, n_layers)
    return list(range(k)) if side == "first" else list(range(n_layers - k, n_layers))


def _check_layers(config: Any) -> None:
    """config.layers is a layer spec (layer_subset's grammar)."""
    if config.layers is None:  # H2OConfig: the role's default (core/config.py DEFAULT_H2O_LAYERS)
        return
    try:
        layer_subset(config.layers, 1)
    except ConfigError as err:
        raise _error(config, err.args[0], "layers") from None


def setting(default: Any, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A config field with what the front ends show of it: its help text and, for a string, the
    values it takes. core/request.SETTINGS turns each field into its CLI flag and server field, and
    the settings table of docs/usage.md; the field's own check stays in its config."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class H2OConfig:
    """H2O two-phase chunked sparse prefill.

    chunk_size (S, llama.cpp n_ubatch): tokens per chunk; phase 1 is causal inside a chunk.
    batch_size (B, llama.cpp n_batch): tokens per logical batch; a multiple of S. It only schedules the work
    (steps of min(B, the model's step)): 16384 makes a GPU's 16K steps whole batches (h2o_walk_ops.md).
    local (L): tail tokens of a chunk always kept in its memory set.
    heavy (H): heavy hitters kept by accumulated score.
    dense_tail (W): the last W prompt tokens attend causally to EVERY prompt key in every layer
    (query-aware finish: the first generated token then reads the whole prompt, as decode does);
    every other query keeps K(i). W = 0 is seed 001's method exactly. Within a layer, scores and
    memory sets do not depend on W: the tail's walk attention still votes, and no memory set is
    built after the final chunk (later layers see the tail's changed hidden states, as they must).
    H2O is enabled iff L + H > 0. L + H < S is enforced by clamping (heavy first, then local)
    with a SpecfillWarning, as the llama.cpp plan does.
    layers: the layers that run H2O; the others attend causally to every key (full attention), so
    their keys and values are computed from whole-prompt context: "all" (seed 001's method in every
    layer), "first-K" / "last-K" (K layers) or "first-F" / "last-F" (a share F in (0, 1) of them,
    at least one), the grammar of SpecPrefillConfig.layers. None (not given): the role's default,
    "first-0.33" in the main model (DEFAULT_H2O_LAYERS: measured, issue 34: H2O's attention saving
    shrinks to a third, its answers hold) and "all" in a speculator's prompt pass (speculator_h2o:
    `speculator_prefill=H2OConfig()` and `"h2o"` are one setting, issue 47).
    memory_share: None (L and H as given) or a share of the prompt in (0, 1): a prompt of N tokens
    then gets L + H = round(share * N) (at least 1, below S), split in the given L:H proportion
    (half and half when both are 0): a memory growing with the prompt rather than fixed
    (issue 24). `for_prompt(N)` resolves it; the H2O walk resolves every config it is handed.
    """

    chunk_size: int = setting(1024, "H2O chunk size S: tokens per chunk (llama.cpp's n_ubatch)")
    batch_size: int = setting(16384, "H2O logical batch B: a multiple of S (llama.cpp's n_batch)")
    local: int = setting(256, "H2O local window L: each chunk's last L tokens stay in its memory set")
    heavy: int = setting(256, "H2O heavy hitters H: the tokens with the highest accumulated scores kept")
    # measured: results/eval/fidelity/demo_h2o_dense_tail.md (docs/results.md)
    dense_tail: int = setting(
        64, "H2O dense tail W: the last W prompt tokens attend to every prompt key (0 = seed 001's method exactly)"
    )
    memory_share: float | None = setting(
        None, "H2O memory L+H as this share of the prompt (split L:H as given, below S); none: fixed L, H"
    )
    layers: str | None = setting(
        None,
        "H2O: the layers that run it (all, first-K, last-K, first-F, last-F "
        f"with F a share); the others attend to every key (none given: {DEFAULT_H2O_LAYERS} in the "
        "main model, all in a speculator's prompt pass)",
    )

    def __post_init__(self) -> None:
        s = _require_int(self, "chunk_size", 1, "chunk_size (S)")
        _check_layers(self)
        if self.memory_share is not None:
            share = _require_share(self, "memory_share")
            if share >= 1.0:
                raise _error(
                    self,
                    f"memory_share must be below 1 (the memory is part of the prompt), got {share}",
                    "memory_share",
                )
            object.__setattr__(self, "memory_share", share)
        _require_int(self, "dense_tail", 0, "dense_tail (W)")
        b = _require_int(self, "batch_size", 1, "batch_size (B)")
        local = _require_int(self, "local", 0, "local (L)")
        heavy = _require_int(self, "heavy", 0, "heavy (H)")
        if b % s != 0:
            raise _error(
                self, f"batch_size (B={b}) must be a multiple of chunk_size (S={s})", "chunk_size", "batch_size"
            )
        if local + heavy >= s:
            new_local = min(local, s - 1)
            new_heavy = max(0, min(heavy, s - 1 - new_local))
            warnings.warn(
                f"H2O memory L+H={local + heavy} must be < chunk_size S={s}: clamped to L={new_local}, H={new_heavy}",
                SpecfillWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "local", new_local)
            object.__setattr__(self, "heavy", new_heavy)

    @property
    def enabled(self) -> bool:
        return self.local + self.heavy > 0

    @property
    def memory_size(self) -> int:
        """M = L + H, the size of every memory set."""
        return self.local + self.heavy

    def for_prompt(self, n_tokens: int) -> "H2OConfig":
        """The config a prompt of n_tokens runs with: itself, or (memory_share set) L + H =
        round(share * N) clamped to [1, S - 1], split in the L:H proportion given (local rounded,
        heavy the rest). Memory sets stay below S: the next chunk attends to them and itself."""
        if self.memory_share is None:
            return self
        memory = max(1, min(self.chunk_size - 1, round(self.memory_share * n_tokens)))
        given = self.local + self.heavy
        local = round(memory * (self.local / given if given else 0.5))
        return H2OConfig(self.chunk_size, self.batch_size, local, memory - local, self.dense_tail, layers=self.layers)

    def layer_indices(self, n_layers: int) -> list[int]:
        """The layers that run H2O (layer_subset); the others attend to every key."""
        return layer_subset(self.layers or DEFAULT_H2O_LAYERS, n_layers)


def speculator_h2o(**fields: Any) -> H2OConfig:
    """The H2O a speculator's prompt pass runs with "h2o": H2O's sizes (`fields` on top) in every
    layer. The main model's default runs H2O in its first third only, because later layers' drifted
    keys and values cost answers (research/h2o_fidelity); a speculator's cache is never answered
    from, only scored (its keys ranked by its queries), and first-0.33 would give up two thirds of
    the saving on the pass that dominates SpecPrefill at long prompts (docs/methods.md)."""
    return H2OConfig(**{"layers": "all", **fields})


def _speculator_prefill(config: "SpecPrefillConfig") -> H2OConfig | None:
    """config.speculator_prefill as the pass runs it: None ("dense") or an H2OConfig ("h2o": speculator_h2o())."""
    value = config.speculator_prefill
    if isinstance(value, H2OConfig):  # layers not given: every layer, however the setting was spelled
        return value if value.layers is not None else dataclasses.replace(value, layers="all")
    if value is None:
        return value
    if isinstance(value, str) and value.strip().lower() in SPECULATOR_PREFILLS:
        return speculator_h2o() if value.strip().lower() == "h2o" else None
    raise _error(
        config,
        f"speculator_prefill must be h2o, dense or an H2OConfig, got {value!r}",
        "speculator_prefill",
    )


@dataclass(frozen=True)
class SpecPrefillConfig:
    """Speculative prefill (paper section 'Speculative Prefill', seed 002).

    keep_ratio: fraction of selection chunks kept (ceil(n_chunks * keep_ratio)); or
    keep_tokens: a token budget, kept as ceil(keep_tokens / select_chunk) chunks (>= 1); or
    keep_mass: the importance-mass rule (below). At most one of the three is set: none means
    keep_ratio 0.3 (DEFAULT_KEEP_RATIO; the paper's is 0.1: `paper()`); two is a ConfigError (so a
    `replace(config, keep_ratio=...)` on a token-budget
    or mass config fails loudly: use with_keep).
    lookahead (N): greedy speculator decode steps whose queries also score the prompt.
    pool_kernel: odd width of the average pooling along positions (1 = off).
    select_chunk: tokens per selection chunk (1 = token-level selection).
    layers: speculator layers used for scoring: "all" (the paper's max over every layer; the
    default: no window rule beat it across self:8 and self:12, see docs/results.md, Fidelity), "last-K" (a
    window of K layers ending at the speculator's last), "last-1" (the last layer only) or "first-K" /
    "first-F" (its first layers: with no look-ahead the speculator's pass then stops after them, as
    nothing reads deeper: methods/speculator_depth.pass_depth).
    head_reduction / layer_reduction: "max" (paper) or "mean".
    lookahead_reduction: over the scoring queries (the last prompt token, then each look-ahead
    token): "mean" (paper) or "max" (a token one answer step reads strongly counts fully, not
    divided by the steps: a multi-hop answer reads a different statement at each step).
    keep_mass: None, or the importance-mass rule replacing keep_ratio / keep_tokens: keep the
    fewest top chunks whose importance sums to this share of the prompt's, but at least
    mass_floor and at most mass_ceiling of the chunks (ratios; None: 0.05, 0.5; without keep_mass:
    a ConfigError): a peaked score (one needle) keeps few chunks, a spread one (a chain) more.
    keep_growth (g in [0, 1]; None: 1): with the ratio rule, the tokens kept grow as the prompt's
    length ** g past growth_from tokens (default GROWTH_FROM, 4096): the share kept is keep_ratio x
    min(1, (P / growth_from) ** (g - 1)), so a 32K prompt at keep 0.3, g 0.7 keeps 0.16 of it; g 0
    holds keep_ratio x growth_from tokens (issue 47: research/keep_length). growth_from: that length
    (an integer >= 1; without keep_growth it changes nothing).
    neighbours: also keep this many chunks (a fraction: the nearest ceil(neighbours x select_chunk)
    tokens) on each side of every selected chunk: context around what was found, the rest of a
    statement a chunk boundary cut; the kept count grows up to (2 * neighbours + 1) times.
    force_keep_last: always keep the last prompt token so decoding has its context.
    token_floor: keep at least this many tokens (in whole chunks) whatever the keep rule says:
    a short prompt's 10% is too few to hold a question and its answer (0: no floor).
    keep_first / keep_last: the prompt's first / last this many tokens are always kept, on top of
    the budget (the system prompt and instructions; the question and the chat template's turn
    markers, which every answer reads) (0: none; force_keep_last still keeps the last token).
    query_window (W >= 1): the queries of the prompt's last W tokens score the prompt, each over
    the keys at or before its own position (an observation window, as SnapKV's); 1 is the paper's
    (the last prompt token only). The look-ahead queries follow them; lookahead_reduction runs
    over all W + N of them. W is clamped to the prompt's length.
    select_units: what is kept or dropped whole: "chunks" (select_chunk tokens each, the paper's)
    or "text" (units of at most select_chunk tokens whose boundaries follow the prompt's own lines
    and paragraphs: core/text_units.py; docs/methods.md, Selection units). Text units are ranked by
    mean importance as chunks are and kept best first until they hold the keep rule's share of the
    prompt's tokens (keep_ratio x P, or keep_tokens; at least token_floor); neighbours are units;
    the mass rule takes chunks only (a ConfigError with "text").
    unit_starts: the token positions where the prompt's text units start (position 0 always
    starts one): one prompt's data, filled from its tokens by the front end when select_units is
    "text" (generation.stream_request, the RULER protocol), as `protected` is; empty with "chunks".
    speculator_prefill: None (or "dense"): the speculator's prompt pass attends to every key, as
    the paper's; an H2OConfig (or "h2o": speculator_h2o(), H2O in every layer) runs that pass as
    H2O prefill, the look-ahead steps and the scoring still reading every prompt key (docs/methods.md,
    SpecPrefill over an H2O speculator).
    """

    keep_ratio: float | None = setting(
        None,
        f"SpecPrefill: the share of the prompt's chunks kept, in (0, 1] "
        f"(none given: {DEFAULT_KEEP_RATIO}; the paper's 0.1 loses multi-hop "
        f"answers: docs/eval.md)",
    )
    keep_tokens: int | None = setting(None, "SpecPrefill: a token budget instead of a ratio")
    keep_growth: float | None = setting(
        None,
        "SpecPrefill: with a keep ratio, the tokens kept grow as the prompt's length ** g past growth_from "
        "tokens, g in [0, 1] (none: 1, a fixed share; 0: a fixed budget)",
    )
    growth_from: int = setting(
        GROWTH_FROM, "SpecPrefill: with keep_growth, the prompt length (tokens) up to which the keep ratio holds"
    )
    lookahead: int = setting(
        8,
        "SpecPrefill look-ahead N: greedy speculator steps whose queries also score the "
        "prompt (clamped to the speculator's context)",
    )
    pool_kernel: int = setting(13, "SpecPrefill: odd width of the average pooling of the scores (1 = off)")
    select_chunk: int = setting(32, "SpecPrefill: tokens per selection chunk (1 = token-level selection)")
    layers: str = setting(
        "all",
        "SpecPrefill scoring layers of the speculator: all (the paper's max over every "
        "layer), last-K (a window of K layers ending at its last), last-1 (the last only) or first-K / "
        "first-F (its first layers; with look-ahead 0 its pass runs only those)",
    )
    head_reduction: str = setting("max", "SpecPrefill: mean or max over the speculator's attention heads", REDUCTIONS)
    layer_reduction: str = setting("max", "SpecPrefill: mean or max over the speculator's scoring layers", REDUCTIONS)
    force_keep_last: bool = setting(True, "SpecPrefill: always keep the last prompt token (decoding reads it)")
    lookahead_reduction: str = setting(
        "mean", "SpecPrefill: mean (paper) or max over the look-ahead queries' scores", REDUCTIONS
    )
    keep_mass: float | None = setting(
        None,
        "SpecPrefill importance-mass rule (replaces the keep ratio or "
        "budget): the fewest chunks holding this share of the speculator's "
        "attention mass, within mass_floor and mass_ceiling of the chunks",
    )
    mass_floor: float | None = setting(
        None, f"with keep_mass: keep at least this share of the chunks (none given: {MASS_FLOOR})"
    )
    mass_ceiling: float | None = setting(
        None, f"with keep_mass: keep at most this share of the chunks (none given: {MASS_CEILING})"
    )
    neighbours: float = setting(0, "SpecPrefill: keep this many chunks (or a share of one) around each kept chunk")
    token_floor: int = setting(0, "SpecPrefill: keep at least this many tokens whatever the keep rule says")
    keep_first: int = setting(0, "SpecPrefill: always keep the prompt's first N tokens (on top of the budget)")
    keep_last: int = setting(0, "SpecPrefill: always keep the prompt's last N tokens (on top of the budget)")
    protected: tuple[tuple[int, int], ...] = setting(
        (),
        "SpecPrefill: prompt token spans [start, end) always kept, on top of the budget (a server "
        "request's protect field fills them from its chat template's segments)",
    )
    select_units: str = setting(
        "chunks",
        "SpecPrefill: the units kept or dropped whole: chunks (select_chunk tokens each) or text "
        "(at most select_chunk tokens each, cut where the prompt's lines and paragraphs end)",
        SELECT_UNITS,
    )
    unit_starts: tuple[int, ...] = setting(
        (),
        "SpecPrefill: token positions where the prompt's text units start (select_units text: "
        "filled from the prompt's tokens)",
    )
    query_window: int = setting(
        1,
        "SpecPrefill: the prompt's last W tokens' queries score the prompt too, each "
        "over the keys before it (1: the last token only, the paper's)",
    )
    speculator_prefill: H2OConfig | None = setting(
        None,
        "SpecPrefill: the speculator's prompt pass, dense (every key) or h2o (H2O's default sizes in "
        "every layer; the look-ahead still scores every prompt key; API: an H2OConfig)",
        SPECULATOR_PREFILLS,
    )
    deep_keep: float | None = setting(
        None,
        "SpecPrefill: the share of the prompt a nested speculator's deeper layers (past layers first-K, or from "
        f"deep_from) read, ranked by the last {DEEP_WINDOW} prompt queries of the layers before (none: every token)",
    )
    deep_from: float | None = setting(
        None,
        "SpecPrefill with deep_keep: the first speculator layer that reads only that share, K >= 1 or a share F in "
        "(0, 1) of the layers (none: the one after layers first-K); scored layers from it on score over its keys",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculator_prefill", _speculator_prefill(self))
        _check_keep_rule(self, KEEP_RULES, DEFAULT_KEEP_RATIO, (MASS_FLOOR, MASS_CEILING))
        _require_int(self, "lookahead", 0)
        _require_int(self, "pool_kernel", 1)
        if self.pool_kernel % 2 == 0:
            raise _error(self, f"pool_kernel must be odd (centred pooling), got {self.pool_kernel}", "pool_kernel")
        _require_int(self, "select_chunk", 1)
        for name in ("token_floor", "keep_first", "keep_last"):
            _require_int(self, name, 0)
        _check_spans(self)
        _check_units(self)
        _require_int(self, "query_window", 1)
        for name in ("head_reduction", "layer_reduction", "lookahead_reduction"):
            if getattr(self, name) not in REDUCTIONS:
                raise _error(self, f"{name} must be one of {REDUCTIONS}, got {getattr(self, name)!r}", name)
        _check_layers(self)
        _check_deep_keep(self)

    @classmethod
    def paper(cls, **fields: Any) -> "SpecPrefillConfig":
        """The paper's setting (keep 10%, max over heads and layers, mean over the look-ahead), with
        `fields` on top: the reference implementation's numbers, faster and less accurate than the default."""
        return cls(**{"keep_ratio": PAPER_KEEP_RATIO, **fields})

    def with_keep(
        self, ratio: float | None = None, tokens: int | None = None, mass: float | None = None
    ) -> "SpecPrefillConfig":
        """This config keeping `ratio` of the chunks, a `tokens` budget or a `mass` share of the
        importance (at most one given: it replaces the keep setting, a replaced mass rule's bounds
        with it; none: unchanged)."""
        if ratio is None and tokens is None and mass is None:
            return self
        bounds = {} if mass is not None else {"mass_floor": None, "mass_ceiling": None}
        if ratio is None:  # the growth scales a ratio: a budget or a mass rule drops it
            bounds["keep_growth"] = None
        return dataclasses.replace(self, keep_ratio=ratio, keep_tokens=tokens, keep_mass=mass, **bounds)

    def composed(self) -> "SpecPrefillConfig":
        """This config with its speculator prefilling with H2O: its own speculator_prefill, else
        speculator_h2o() (what "specprefill+h2o" runs in auto, bench and eval)."""
        return dataclasses.replace(self, speculator_prefill=self.speculator_prefill or speculator_h2o())

    def layer_indices(self, n_layers: int) -> list[int]:
        """Speculator layers used for scoring (layer_subset)."""
        return layer_subset(self.layers, n_layers)

    def for_new_part(self, reused: int) -> "SpecPrefillConfig":
        """This config for a selection over a prompt's new part after a reused prefix of `reused`
        tokens, as a prompt of its own: keep_first, the protected spans and the text units' starts,
        which count from the whole prompt's start, moved to the new part's (docs/methods.md,
        SpecPrefill from a reused prefix)."""
        spans = tuple((max(0, a - reused), max(0, b - reused)) for a, b in self.protected if b > reused)
        starts = (0, *(s - reused for s in self.unit_starts if s > reused)) if self.unit_starts else ()
        return dataclasses.replace(
            self, keep_first=max(0, self.keep_first - reused), protected=spans, unit_starts=starts
        )

    def n_kept_chunks(self, n_chunks: int) -> int:
        """How many selection chunks survive, for a prompt cut into n_chunks (the mass rule:
        at most; the scores decide within [chunk_range]), before neighbours are added."""
        return self.chunk_range(n_chunks)[1]

    def share(self, n_tokens: int) -> float:
        """The share of an n_tokens prompt the ratio rule keeps: keep_ratio, falling past growth_from
        tokens as (n_tokens / growth_from) ** (keep_growth - 1) when keep_growth is set."""
        if self.keep_growth is None or n_tokens <= self.growth_from:
            return self.keep_ratio
        return self.keep_ratio * (n_tokens / self.growth_from) ** (self.keep_growth - 1.0)

    def token_budget(self, n_tokens: int) -> int:
        """Text units (select_units "text"): how many of an n_tokens prompt's tokens the best units
        must hold (keep_ratio x P rounded up, or keep_tokens; at least token_floor; at most P)."""
        if self.keep_tokens is not None:
            wanted = self.keep_tokens
        else:  # the guard keeps float noise from adding a token, as _fixed_chunks'
            wanted = math.ceil(n_tokens * self.share(n_tokens) - 1e-9)
        return min(n_tokens, max(1, wanted, self.token_floor))

    def chunk_range(self, n_chunks: int) -> tuple[int, int]:
        """(fewest, most) selected chunks: equal unless the mass rule is on (its floor, ceiling)."""
        if n_chunks <= 0:
            return 0, 0
        floor = min(n_chunks, math.ceil(self.token_floor / self.select_chunk))
        if self.keep_mass is not None:
            low, high = (
                max(1, floor, min(n_chunks, math.ceil(n_chunks * r - 1e-9)))
                for r in (self.mass_floor, self.mass_ceiling)
            )
            return low, high
        k = max(floor, self._fixed_chunks(n_chunks))
        return k, k

    def _fixed_chunks(self, n_chunks: int) -> int:
        if self.keep_tokens is not None:
            k = math.ceil(self.keep_tokens / self.select_chunk)
        else:
            # the guard keeps float noise (10 * 0.3 = 3.0000000000000004) from adding a chunk
            k = math.ceil(n_chunks * self.share(n_chunks * self.select_chunk) - 1e-9)
        return max(1, min(n_chunks, k))


# On a turn's new part below AUTO_COMPOSITION_FROM auto weighs the composition at SpecPrefill's keep rule, its
# speculator nested: 18/20 4K turn samples as the default, 1.36-1.44x full on 4K turns (docs/methods.md "auto").
AUTO_TURN_COMPOSITION = SpecPrefillConfig(speculator_prefill="h2o", query_window=32, deep_keep=0.3, deep_from=0.5)
# `auto` with a speculator and SpecPrefill's defaults also weighs it as AUTO_COMPOSITION on a fresh prompt or a
# turn's new part of AUTO_COMPOSITION_FROM tokens on, where its evidence holds (issue 47; docs/eval.md): decoded
# within one sample of full on each of four RULER tasks at 8K and 16K (16-18% kept); on 8K turns the samples
# AUTO_TURN_COMPOSITION keeps at 18% kept, not 30%. Past 16,384 tokens its budget holds at 1,639 chunk tokens
# (keep_growth 0: 0.05 at 32K; on the 32K proxy keep 0.05-0.08's samples, one HotpotQA sample of 20 less than keep
# 0.1, composition_keeps_32k.json; decoded: ruler_32k_budget.md, docs/eval.md); past 32K unmeasured.
AUTO_COMPOSITION_FROM = 7_800
AUTO_COMPOSITION = dataclasses.replace(
    AUTO_TURN_COMPOSITION, keep_ratio=0.1, keep_growth=0, growth_from=16_384, neighbours=1
)


@dataclass(frozen=True)
class Drafting:
    """Speculative decoding: `model` drafts up to `num_tokens` (k >= 1) tokens per round. model: a
    CausalLM on the main model's backend and vocabulary, "self:K" (the main model's first K layers,
    sharing its cache), or None with SpecPrefill (the speculator drafts from its prompt KV).
    adaptive: each round's k follows the running acceptance and the measured step costs, up to
    num_tokens, 0 where drafting cannot pay (core/methods/draft_length.DraftLength); False: always num_tokens."""

    model: Any = setting(None, "speculative decoding: a draft model path, or self:K (the main model's first K layers)")
    num_tokens: int = setting(
        3,
        "tokens drafted per round (default 3 with a draft model); with method specprefill "
        "and no draft model, the speculator drafts from the prompt KV it already built",
    )
    adaptive: bool = setting(True, "the draft length follows the running acceptance and the measured step costs")

    def __post_init__(self) -> None:
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1:
            raise _error(self, f"num_draft_tokens must be an integer >= 1, got {self.num_tokens!r}", "num_tokens")
