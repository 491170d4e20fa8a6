"""Checks of the generation settings shared by the API and the CLI: ranges, the clamps the
README documents, and one warning for settings that do nothing for the chosen method.

Clamps (to the prompt, once its length is known):
- look-ahead N: to what the speculator's context holds after the prompt, with a notice (the
  backends stop there anyway; the notice says so instead of silently decoding thousands of steps);
- select_chunk: to the prompt length, and pool_kernel: to 2 * prompt - 1, both silently: beyond
  those the whole prompt is one selection chunk / every pooling window covers the whole prompt,
  so the selection is the same and no buffer the size of the setting is allocated.
"""
from __future__ import annotations

import math
import operator
import warnings
from dataclasses import replace
from typing import Any, Sequence

from specfill.core import ConfigError, H2OConfig, SpecfillWarning, SpecPrefillConfig
from specfill.core.errors import quote
from specfill.core.runtime import PrefillMethod, SamplingConfig

MAX_SEED = 2**63 - 1  # torch and MLX take unsigned 64-bit seeds; 2**63 - 1 keeps them portable


def check_sampling(temperature: Any, top_p: Any, seed: Any) -> None:
    """temperature finite and >= 0, top_p in (0, 1], seed None or an int in [0, 2**63 - 1];
    top_p or seed with greedy decoding (temperature 0) warn that they do nothing."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise ConfigError(f"seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    if temperature == 0 and (top_p != 1.0 or seed is not None):
        warnings.warn("top_p and seed do nothing with temperature 0 (greedy decoding)", SpecfillWarning, stacklevel=3)


def sampling_config(temperature: Any, top_p: Any, seed: Any, **host_side: Any) -> SamplingConfig:
    """The SamplingConfig after check_sampling; host_side: top_k, min_p and the repetition /
    presence / frequency penalties (numbers of the right kind, ranges checked by SamplingConfig)."""
    check_sampling(temperature, top_p, seed)
    for name, value in host_side.items():
        kind = int if name == "top_k" else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
            raise ConfigError(f"{name} must be {'an integer' if kind is int else 'a finite number'}, got {value!r}")
    return SamplingConfig(float(temperature), float(top_p), seed, **host_side)


def prompt_ids(ids: Sequence[Any], vocab_size: int) -> list[int]:
    """The prompt as ids, each an integer inside the model's vocabulary, and at least one."""
    try:
        checked = [operator.index(t) for t in ids]
    except TypeError:
        raise ConfigError("prompt ids must be integers") from None
    if not checked:
        raise ConfigError("the prompt is empty")
    bad = next((t for t in checked if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ConfigError(f"prompt token id {bad} is outside the model's vocabulary of {vocab_size}")
    return checked


def warn_unused(method: str, *, h2o: H2OConfig | None, specprefill: SpecPrefillConfig | None,
                speculator: Any) -> None:
    """One warning naming the settings given for another method than `method`."""
    unused = ([] if method == "h2o" or h2o is None else ["H2O settings"]) + \
        ([] if method == "specprefill" or specprefill is None else ["SpecPrefill settings"]) + \
        ([] if method == "specprefill" or speculator is None else ["a speculator"])
    if unused:
        warnings.warn(f"{' and '.join(unused)} do nothing with method {method!r}", SpecfillWarning, stacklevel=3)


def fit_to_prompt(plan: PrefillMethod, n_prompt: int, main_context: int) -> PrefillMethod:
    """The SpecPrefill settings clamped to an n_prompt-token prompt (see the module docstring)."""
    if plan.name != "specprefill" or plan.specprefill is None or n_prompt < 1:
        return plan
    config = plan.specprefill
    context = main_context if isinstance(plan.speculator, str) else plan.speculator.args.max_position_embeddings
    changes: dict[str, int] = {}
    if config.lookahead > context - n_prompt >= 0:
        changes["lookahead"] = context - n_prompt
        warnings.warn(f"look-ahead {config.lookahead} clamped to {context - n_prompt}: the speculator's context "
                      f"of {context} tokens holds the {n_prompt}-token prompt and no more", SpecfillWarning,
                      stacklevel=3)
    if config.select_chunk > n_prompt:
        changes["select_chunk"] = n_prompt
    if config.pool_kernel > 2 * n_prompt - 1:
        changes["pool_kernel"] = 2 * n_prompt - 1
    return replace(plan, specprefill=replace(config, **changes)) if changes else plan


def read_prompt_file(path: str, what: str = "--prompt-file") -> str:
    """A prompt file's text: readable (a pipe such as <(...) works too) and UTF-8, else one ConfigError line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {quote(path)}: {err.strerror}") from None
    return decode_utf8(data, f"{what} {path}")


def decode_utf8(data: bytes, source: str) -> str:
    """Prompt bytes as text; anything but UTF-8 is one ConfigError line naming `source`."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source} is not UTF-8 text (invalid byte at offset {err.start})") from None
