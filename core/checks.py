"""Typed checks of values read from files and settings, and of what a loaded model computes (one
line each when they fail).

Model files are input like any other: a GGUF key or a config.json entry may hold NaN, a string,
an array or a number out of range. Each reader converts a value it consumes with one of these,
naming where it came from, so a bad value is a one-line error of the caller's type
(ModelLoadError for files, ConfigError for settings) instead of a TypeError or a NaN model.

A model that loads but computes NaN or Inf logits stops with an error naming the likely cause
(check_logits_finite), never prints an end token and exits 0. It is backend-neutral: the caller
reduces its logits to one bool in its own array library (one device-to-host transfer, not the
whole [T, vocab] array) and passes it here.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Protocol

from .errors import ModelLoadError, NonFiniteLogitsError, SpecfillError


class NumericSettings(Protocol):
    """What check_logits_finite names of a model's settings (core/models.py's ModelArgs has them;
    models.py imports this module, so it is not imported back)."""

    rms_norm_eps: float
    rope_theta: float


MAX_SIZE = 2**31 - 1  # any model size, count or token id; larger ones are corrupt, not big
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def integer(
    value: Any, what: str, minimum: int = 0, maximum: int = MAX_SIZE, error: type[SpecfillError] = ModelLoadError
) -> int:
    """An int (bool and float refused: a float where an id belongs is corruption) in range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what} must be an integer, got {_show(value)}")
    if not minimum <= value <= maximum:
        raise error(f"{what} must be in [{minimum}, {maximum}], got {value}")
    return value


def positive_float(value: Any, what: str, error: type[SpecfillError] = ModelLoadError) -> float:
    """A finite number > 0 (an eps or RoPE base of NaN, inf, 0 or < 0 makes every logit NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be a number, got {_show(value)}")
    number = float(value)
    if not (math.isfinite(number) and number > 0.0):
        raise error(f"{what} must be finite and > 0, got {number}")
    return number


def text(value: Any, what: str, error: type[SpecfillError] = ModelLoadError) -> str:
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {_show(value)}")
    return value


def flag(value: Any, what: str, error: type[SpecfillError] = ModelLoadError) -> bool:
    if not isinstance(value, bool):
        raise error(f"{what} must be true or false, got {_show(value)}")
    return value


def typed_list(value: Any, kind: type, what: str, error: type[SpecfillError] = ModelLoadError) -> list:
    """A list whose items are all `kind` (int items: not bool; float items: int or float)."""
    kinds = (int, float) if kind is float else (kind,)
    if not isinstance(value, list) or any(
        isinstance(v, bool) != (kind is bool) or not isinstance(v, kinds) for v in value
    ):
        raise error(f"{what} must be a list of {kind.__name__}, got {_show(value)}")
    return value


def check_rope_scaling(scaling: Mapping[str, Any] | None, what: str) -> None:
    """rope_scaling (keyed by "rope_type") is a supported type with every parameter it needs,
    each finite and in range; ModelLoadError naming the missing or bad one otherwise."""
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise ModelLoadError(f"{what}: rope_scaling must be a mapping, got {_show(scaling)}")
    kind = scaling.get("rope_type")
    if not isinstance(kind, str) or kind not in ROPE_SCALING_KEYS:
        raise ModelLoadError(f"rope scaling type {kind!r} is not supported (supported: linear, llama3)")
    missing = [key for key in ROPE_SCALING_KEYS[kind] if key not in scaling]
    if missing:
        raise ModelLoadError(f"{what}: {kind} rope scaling lacks {', '.join(missing)}")
    factor = positive_float(scaling["factor"], f"{what}: rope scaling factor")
    if kind == "llama3":
        if factor < 1.0:
            raise ModelLoadError(f"{what}: llama3 rope scaling factor must be >= 1, got {factor}")
        low = positive_float(scaling["low_freq_factor"], f"{what}: rope scaling low_freq_factor")
        high = positive_float(scaling["high_freq_factor"], f"{what}: rope scaling high_freq_factor")
        if not high > low:
            raise ModelLoadError(f"{what}: rope scaling high_freq_factor {high} must exceed low_freq_factor {low}")
        integer(
            scaling["original_max_position_embeddings"],
            f"{what}: rope scaling original_max_position_embeddings",
            minimum=1,
        )


def _show(value: Any) -> str:
    """A short description of a bad value (a 10**6-element list is not printed)."""
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)} items"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


HALF_DTYPES = ("float16", "fp16", "half", "bfloat16", "bf16")


def check_logits_finite(all_finite: bool, args: NumericSettings, *, where: str, dtype: str | None = None) -> None:
    """Raise NonFiniteLogitsError unless `all_finite` (every logit of `where`, e.g. "the first
    prefill", is finite). The message names the likely cause: half-precision overflow when the
    model runs in float16 / bfloat16, else the checkpoint's weights or numerics."""
    if all_finite:
        return
    if dtype is not None and str(dtype).lower() in HALF_DTYPES:
        cause = f"the activations overflowed {dtype}: load the model with dtype float32 (--dtype float32)"
    else:
        cause = (
            f"the checkpoint's weights or numerics are broken (corrupt tensors or quantization "
            f"scales, or an out-of-range setting: rms_norm_eps={args.rms_norm_eps:g}, "
            f"rope_theta={args.rope_theta:g})"
        )
    raise NonFiniteLogitsError(f"the model computed NaN or Inf logits in {where}: {cause}")
