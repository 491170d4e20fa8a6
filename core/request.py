"""One generation request, built and checked in one place: the API, the CLI and the server each
translate their input (keywords, flags, HTTP fields) into `build_request`, and the driver runs
what comes out (CausalLM.generate_step with its parts).

Every setting has one field here (or in the config it lives in: H2OConfig, SpecPrefillConfig,
SamplingConfig, Drafting, PrefillMethod, each checking its own values) and one check.

SETTINGS is the one table of settings: every field of those configs with its public names. The
configs' fields are the source (name, default, type; help text and choices from `config.setting`).
A field's public names follow one rule, the config's prefix before the field name: `--h2o-local`
on the command line and `h2o_local` in a server request for H2OConfig.local, `--neighbours` and
`neighbours` for SpecPrefillConfig.neighbours. ALIASES holds the few names that differ
(llama.cpp's `-ub` / `-b`, `--keep` for the keep ratio and the token budget, `--temp`, ...);
PRIVATE the fields a front end does not offer, each with its reason. cli/options.py builds its
flags from the table, specfill/serve/protocol.py its request fields, docs/usage.md shows it
(`markdown_table`), and a ConfigError's (config, field) finds the request field at fault here
(`server_field`).

What needs the model or the prompt (token ids inside the vocabulary, the context, the
speculator's backend, vocabulary and context, the clamps of SpecPrefill settings to the prompt)
is checked once, when the request runs, in its plan (core/plan.py); `fit_to_prompt` below is the
clamp of the SpecPrefill settings to the prompt it applies.

Clamps (to the prompt, once its length is known):
- look-ahead N: to what the speculator's context holds after the prompt, with a notice (the
  backends stop there anyway; the notice says so instead of silently decoding thousands of steps);
- select_chunk: to the prompt length, and pool_kernel: to 2 * prompt - 1, both silently: beyond
  those the whole prompt is one selection chunk / every pooling window covers the whole prompt,
  so the selection is the same and no buffer the size of the setting is allocated.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from dataclasses import dataclass, replace
from typing import Any

from .config import H2OConfig, SpecPrefillConfig
from .config_checks import MAX_SETTING
from .errors import ConfigError, SpecfillWarning
from .runtime import Drafting, PrefillMethod, SamplingConfig, check_drafting

DEFAULT_NUM_DRAFT_TOKENS = 3  # mlx-lm's default


CONFIGS = (H2OConfig, SpecPrefillConfig, SamplingConfig, Drafting, PrefillMethod)
PREFIX = {"H2OConfig": "h2o"}  # the rest: the field's own name
CLI, SERVER = "cli", "server"

# (config, field) -> {front end: public name(s)} where the rule's name is not the public one
ALIASES: dict[tuple[str, str], dict[str, Any]] = {
    ("H2OConfig", "chunk_size"): {CLI: ("--chunk-size", "-ub")},  # llama.cpp's n_ubatch
    ("H2OConfig", "batch_size"): {CLI: ("--batch-size", "-b")},  # llama.cpp's n_batch
    ("SpecPrefillConfig", "keep_ratio"): {CLI: ("--keep",)},  # <= 1: a ratio, > 1: a token budget
    ("SpecPrefillConfig", "keep_tokens"): {CLI: ("--keep",)},
    ("SpecPrefillConfig", "layers"): {CLI: ("--score-layers",)},
    ("SamplingConfig", "temperature"): {CLI: ("--temp",)},  # llama.cpp's and mlx-lm's flag
    ("Drafting", "model"): {CLI: ("--draft-model",)},  # mlx-lm's names
    ("Drafting", "num_tokens"): {CLI: ("--num-draft-tokens",), SERVER: "num_draft_tokens"},
    ("PrefillMethod", "name"): {CLI: ("--method",), SERVER: "method"},
}


def _both(config: str, name: str, why: str) -> dict[tuple[str, str, str], str]:
    """PRIVATE's entries of a field that neither front end names, for the same reason."""
    return {(config, name, CLI): why, (config, name, SERVER): why}


# (config, field, front end) -> why that front end has no name for the field
PRIVATE: dict[tuple[str, str, str], str] = {
    **dict.fromkeys(
        [
            ("H2OConfig", "dense_tail", SERVER),
            ("SpecPrefillConfig", "pool_kernel", SERVER),
            ("SpecPrefillConfig", "select_chunk", SERVER),
            ("SpecPrefillConfig", "layers", SERVER),
        ],
        "server-wide: the server's command-line flag sets it for every request",
    ),
    ("SpecPrefillConfig", "protected", CLI): "one prompt's token positions: the server's protect field names segments",
    ("SpecPrefillConfig", "protected", SERVER): "token positions: a request names segments instead (its protect field)",
    **_both(
        "SpecPrefillConfig", "unit_starts", "one prompt's token positions: select_units text fills them from its tokens"
    ),
    **_both("SpecPrefillConfig", "force_keep_last", "library only: off drops the token decoding continues from"),
    ("Drafting", "model", SERVER): "a request cannot load a model: the server's --speculator drafts",
    **_both("Drafting", "adaptive", "library only: the fixed draft length of earlier versions, for comparisons"),
    ("PrefillMethod", "speculator", SERVER): "a request cannot load a model: the server's --speculator is loaded once",
    **_both("PrefillMethod", "h2o", "a config, not a setting: its fields are (H2OConfig)"),
    **_both("PrefillMethod", "specprefill", "a config, not a setting: its fields are (SpecPrefillConfig)"),
}


@dataclass(frozen=True)
class Setting:
    """One config field and its public names: cli the flags (() when the CLI has none), server the
    request field (None when requests have none); kind int, float, str or bool; optional: None is
    a value (the setting is off or resolved later)."""

    config: str
    field: str
    default: Any
    kind: type
    optional: bool
    help: str
    choices: tuple[str, ...]
    cli: tuple[str, ...]
    server: str | None


def _kind(annotation: str) -> tuple[type, bool]:
    """(int / float / str / bool / object, whether None is allowed) of a field's annotation text."""
    parts = [part.strip() for part in str(annotation).split("|")]
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    kind = next((kinds[p] for p in parts if p in kinds), object)
    return kind, "None" in parts or kind is object


def _public(config: str, name: str) -> tuple[tuple[str, ...], str | None]:
    """The field's (CLI flags, server field): its alias, else the rule; none where PRIVATE says why."""
    alias = ALIASES.get((config, name), {})
    stem = f"{PREFIX[config]}_{name}" if config in PREFIX else name
    cli = () if (config, name, CLI) in PRIVATE else tuple(alias.get(CLI, (f"--{stem.replace('_', '-')}",)))
    server = None if (config, name, SERVER) in PRIVATE else alias.get(SERVER, stem)
    return cli, server


def _table() -> tuple[Setting, ...]:
    rows = []
    for config in CONFIGS:
        for f in dataclasses.fields(config):
            kind, optional = _kind(f.type)
            if kind is object and f.metadata.get("choices"):
                kind = str  # a config chosen by name (SpecPrefillConfig.speculator_prefill: h2o | dense)
            cli, server = _public(config.__name__, f.name)
            rows.append(
                Setting(
                    config.__name__,
                    f.name,
                    f.default,
                    kind,
                    optional,
                    f.metadata.get("help", ""),
                    tuple(f.metadata.get("choices", ())),
                    cli,
                    server,
                )
            )
    return tuple(rows)


SETTINGS = _table()


def settings_of(config: type | str) -> tuple[Setting, ...]:
    """The table's rows of one config, in field order."""
    name = config if isinstance(config, str) else config.__name__
    return tuple(s for s in SETTINGS if s.config == name)


def find(config: str, field: str) -> Setting:
    """The table's row of config.field."""
    return next(s for s in SETTINGS if (s.config, s.field) == (config, field))


def server_field(config: str | None, field: str | None) -> str | None:
    """The request field of a config's field (None: requests have none, or no such setting)."""
    return next((s.server for s in SETTINGS if (s.config, s.field) == (config, field)), None)


def markdown_table(configs: tuple[type, ...] = CONFIGS) -> str:
    """The settings as a Markdown table (docs/usage.md holds it; tests/test_settings_table.py keeps
    them equal): config field, CLI flags, request field, default, meaning."""
    lines = [
        "| setting (Python) | CLI flag | HTTP field (`specfill serve`) | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for config in configs:
        for s in settings_of(config):
            if not s.help:
                continue  # a nested config (PrefillMethod.h2o): its own rows
            cli = " ".join(f"`{flag}`" for flag in s.cli) or "-"
            server = f"`{s.server}`" if s.server else "-"
            default = "-" if s.default is None else f"`{s.default}`"
            meaning = s.help.replace("|", "\\|")
            lines.append(f"| `{s.config}.{s.field}` | {cli} | {server} | {default} | {meaning} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class GenerationRequest:
    """What one generation needs besides its prompt: built by `build_request` only.

    max_tokens: tokens to generate (>= 1). sampling: the sampler's settings. method: which
    prefill, with its config and speculator ("self:K", a loaded model, or a path the API loads).
    drafting: speculative decoding (None: plain decoding); its model likewise.
    """

    max_tokens: int
    sampling: SamplingConfig
    method: PrefillMethod
    drafting: Drafting | None = None


def build_request(
    *,
    max_tokens: Any = 256,
    method: str | PrefillMethod = "full",
    draft_model: Any = None,
    num_draft_tokens: Any = None,
    **settings: Any,
) -> GenerationRequest:
    """The request for these settings (the keywords of specfill.stream_generate), or one ConfigError
    naming the setting at fault; a SpecfillWarning for settings that do nothing. `settings`: the
    sampler's (SamplingConfig's fields: temperature, top_p, seed, top_k, ...) and the method's
    (prefill_method's keywords: h2o, specprefill, speculator, auto_threshold), each list declared there."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_SETTING:
        raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if unknown := sorted(settings.keys() - SAMPLING_FIELDS - PLAN_KEYWORDS):
        raise TypeError(f"build_request() got unexpected keyword arguments: {', '.join(unknown)}")
    sampling = SamplingConfig(**{k: v for k, v in settings.items() if k in SAMPLING_FIELDS})
    if sampling.temperature == 0 and (sampling.top_p != 1.0 or sampling.seed is not None):
        warnings.warn("top_p and seed do nothing with temperature 0 (greedy decoding)", SpecfillWarning, stacklevel=3)
    plan = (
        method
        if isinstance(method, PrefillMethod)
        else prefill_method(method, **{k: v for k, v in settings.items() if k in PLAN_KEYWORDS})
    )
    drafting = None
    if draft_model is not None or num_draft_tokens is not None:
        drafting = Drafting(draft_model, DEFAULT_NUM_DRAFT_TOKENS if num_draft_tokens is None else num_draft_tokens)
        check_drafting(drafting, plan, sampling)
    return GenerationRequest(max_tokens, sampling, plan, drafting)


def prefill_method(
    method: str = "full",
    *,
    h2o: H2OConfig | None = None,
    specprefill: SpecPrefillConfig | None = None,
    speculator: Any = None,
    auto_threshold: Any = None,
) -> PrefillMethod:
    """The PrefillMethod for a method name, with default configs where none is given; one warning
    naming settings given for another method. "auto": full prefill below the crossover length
    calibrated on this machine (or `auto_threshold`), above it speculative prefill when a
    speculator is given, else H2O (core/crossover.py)."""
    if auto_threshold is not None and method != "auto":
        raise ConfigError(
            "auto_threshold (--auto-threshold) goes with method auto (--method auto)",
            "auto_threshold",
            config="PrefillMethod",
        )
    if method not in ("auto", "h2o", "specprefill"):
        _warn_unused(method, h2o=h2o, specprefill=specprefill, speculator=speculator)
        return PrefillMethod(method)
    if method == "h2o":
        _warn_unused(method, h2o=None, specprefill=specprefill, speculator=speculator)
        return PrefillMethod("h2o", h2o=h2o or H2OConfig())
    if method == "specprefill":
        _warn_unused(method, h2o=h2o, specprefill=None, speculator=None)
        if speculator is None:
            raise ConfigError(
                "speculative prefill needs --speculator (API: speculator=): a model path, a loaded "
                "model, or 'self:K' (the main model's first K layers)",
                "speculator",
                config="PrefillMethod",
            )
        return PrefillMethod("specprefill", specprefill=specprefill or SpecPrefillConfig(), speculator=speculator)
    return PrefillMethod(
        "auto",
        h2o=h2o or H2OConfig(),
        specprefill=specprefill or SpecPrefillConfig(),
        speculator=speculator,
        auto_threshold=auto_threshold,
    )


def _warn_unused(method: str, *, h2o: Any, specprefill: Any, speculator: Any) -> None:
    """One warning naming the settings given for another method than `method`."""
    unused = (
        ([] if h2o is None else ["H2O settings"])
        + ([] if specprefill is None else ["SpecPrefill settings"])
        + ([] if speculator is None else ["a speculator"])
    )
    if unused:
        warnings.warn(f"{' and '.join(unused)} do nothing with method {method!r}", SpecfillWarning, stacklevel=4)


SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingConfig))
PLAN_KEYWORDS = frozenset(inspect.signature(prefill_method).parameters) - {"method"}  # h2o, specprefill, ...


def fit_lookahead(lookahead: int, n_prompt: int, speculator_context: int) -> int:
    """The look-ahead steps an n_prompt-token prompt leaves room for in the speculator's context: the
    one clamp of the look-ahead (the speculator's pass, core/methods/specprefill.run_speculator, runs
    the steps it is given)."""
    return max(0, min(lookahead, speculator_context - n_prompt))


def fit_to_prompt(plan: PrefillMethod, n_prompt: int, speculator_context: int) -> PrefillMethod:
    """The SpecPrefill settings clamped to an n_prompt-token prompt (see the module docstring)."""
    if plan.name != "specprefill" or plan.specprefill is None or n_prompt < 1:
        return plan
    config = plan.specprefill
    changes: dict[str, int] = {}
    if (lookahead := fit_lookahead(config.lookahead, n_prompt, speculator_context)) != config.lookahead:
        changes["lookahead"] = lookahead
        warnings.warn(
            f"look-ahead {config.lookahead} clamped to {lookahead}: the speculator's "
            f"context of {speculator_context} tokens holds the {n_prompt}-token prompt and no more",
            SpecfillWarning,
            stacklevel=4,
        )
    if config.select_chunk > n_prompt:
        changes["select_chunk"] = n_prompt
    if config.pool_kernel > 2 * n_prompt - 1:
        changes["pool_kernel"] = 2 * n_prompt - 1
    return replace(plan, specprefill=replace(config, **changes)) if changes else plan
