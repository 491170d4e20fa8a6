"""The settings' checks (core/config.py's configs call them where each value is made): shares,
integers, protected spans, text units; each failure one ConfigError naming the field."""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError

MAX_SETTING = 2**31 - 1  # no token count or size reaches it; larger values are typos or attacks
SELECT_UNITS = ("chunks", "text")  # SpecPrefillConfig.select_units' values


def _error(config: object, message: str, *fields: str) -> ConfigError:
    """The ConfigError of `config`'s `fields` (the one at fault first)."""
    return ConfigError(message, *fields, config=type(config).__name__)


def _require_share(
    config: object, name: str, value: object = None, label: str | None = None, zero: bool = False
) -> float:
    """config's field `name` (or `value` for it) as a fraction in (0, 1] ([0, 1] with `zero`): a real
    number, not a bool, not NaN."""
    value, label = getattr(config, name) if value is None else value, label or name
    interval = "[0, 1]" if zero else "(0, 1]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        raise _error(config, f"{label} must be a number in {interval}, got {value!r}", name)
    if not (0.0 <= float(value) <= 1.0 if zero else 0.0 < float(value) <= 1.0):
        raise _error(config, f"{label} must be in {interval}, got {value}", name)
    return float(value)


def _check_spans(config: Any) -> None:
    """SpecPrefillConfig.protected as a tuple of (start, end) integer pairs, 0 <= start <= end <= MAX_SETTING."""
    spans = []
    for span in config.protected if isinstance(config.protected, (tuple, list)) else [config.protected]:
        pair = tuple(span) if isinstance(span, (tuple, list)) else ()
        if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in pair):
            raise _error(config, f"protected spans must be (start, end) integer pairs, got {span!r}", "protected")
        if not 0 <= pair[0] <= pair[1] <= MAX_SETTING:
            raise _error(config, f"a protected span needs 0 <= start <= end <= {MAX_SETTING}, got {pair}", "protected")
        spans.append(pair)
    object.__setattr__(config, "protected", tuple(spans))


def _check_units(config: Any) -> None:
    """SpecPrefillConfig.select_units in SELECT_UNITS and unit_starts as ascending unique positions in
    [0, MAX_SETTING] (0 added: it always starts a unit), given only with "text"; "text" takes no mass
    rule; the neighbours around each kept unit (_check_neighbours)."""
    if config.select_units not in SELECT_UNITS:
        raise _error(config, f"select_units must be one of {SELECT_UNITS}, got {config.select_units!r}", "select_units")
    given = config.unit_starts if isinstance(config.unit_starts, (tuple, list)) else [config.unit_starts]
    if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SETTING for v in given):
        raise _error(config, f"unit_starts must be token positions in [0, {MAX_SETTING}], got {given!r}", "unit_starts")
    if given and config.select_units != "text":
        raise _error(config, "unit_starts are text units' starts: give them with select_units text", "unit_starts")
    if config.select_units == "text" and config.keep_mass is not None:
        raise _error(
            config,
            "the mass rule (keep_mass) selects chunks: use keep_ratio or keep_tokens with text units",
            "keep_mass",
            "select_units",
        )
    object.__setattr__(config, "unit_starts", tuple(sorted({0, *given})) if given else ())
    _check_neighbours(config)


def _check_neighbours(config: Any) -> None:
    """SpecPrefillConfig.neighbours: a number of chunks in [0, MAX_SETTING], whole with text units
    (units differ in length: no share of one is defined); a whole float is stored as an int."""
    value = config.neighbours
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or not 0 <= value <= MAX_SETTING:
        raise _error(
            config, f"neighbours must be a number of chunks in [0, {MAX_SETTING}], got {value!r}", "neighbours"
        )
    if value == int(value):
        object.__setattr__(config, "neighbours", int(value))
    elif config.select_units == "text":
        raise _error(config, f"neighbours with text units must be whole units, got {value!r}", "neighbours")


def _require_int(config: object, name: str, minimum: int, label: str | None = None) -> int:
    """config's field `name` as an integer in [minimum, MAX_SETTING]; `label` names it in the message."""
    value, label = getattr(config, name), label or name
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(config, f"{label} must be an integer, got {value!r}", name)
    if not minimum <= value <= MAX_SETTING:
        raise _error(config, f"{label} must be in [{minimum}, {MAX_SETTING}], got {value}", name)
    return value


def _check_keep_rule(config: Any, rules: tuple[str, ...], ratio: float, bounds: tuple[float, float]) -> None:
    """SpecPrefillConfig's keep rule: at most one of `rules` (keep_ratio, keep_tokens, keep_mass);
    the mass rule's bounds only with it (defaults `bounds`), ceiling >= floor; a token budget an
    integer >= 1; else the ratio (default `ratio`) in (0, 1], keep_growth in [0, 1] with it only;
    growth_from an integer >= 1."""
    given = [name for name in rules if getattr(config, name) is not None]
    if len(given) > 1:
        raise _error(
            config,
            f"give one of {', '.join(rules)}, not both {' and '.join(given)} "
            f"(got {' and '.join(repr(getattr(config, name)) for name in given)})",
            *given,
        )
    limits = [name for name in ("mass_floor", "mass_ceiling") if getattr(config, name) is not None]
    if limits and config.keep_mass is None:
        raise _error(
            config,
            f"{' and '.join(limits)} {'bound' if len(limits) > 1 else 'bounds'} the keep_mass "
            f"rule's chunk count: give keep_mass too, or leave {'them' if len(limits) > 1 else 'it'} out",
            *limits,
        )
    if config.keep_growth is not None and given and given[0] != "keep_ratio":
        raise _error(
            config, f"keep_growth scales the keep ratio: give it without {given[0]} (a ratio or none)", "keep_growth"
        )
    if config.keep_mass is not None:
        object.__setattr__(config, "keep_mass", _require_share(config, "keep_mass"))
        floor = _require_share(config, "mass_floor", bounds[0] if config.mass_floor is None else config.mass_floor)
        ceiling = _require_share(
            config, "mass_ceiling", bounds[1] if config.mass_ceiling is None else config.mass_ceiling
        )
        if ceiling < floor:
            raise _error(
                config, f"mass_ceiling ({ceiling}) must be >= mass_floor ({floor})", "mass_ceiling", "mass_floor"
            )
        object.__setattr__(config, "mass_floor", floor)
        object.__setattr__(config, "mass_ceiling", ceiling)
    elif config.keep_tokens is not None:
        _require_int(config, "keep_tokens", 1)
    else:
        value = ratio if config.keep_ratio is None else config.keep_ratio
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _error(config, f"keep ratio must be a number in (0, 1], got {value!r}", "keep_ratio")
        if not (0.0 < float(value) <= 1.0) or math.isnan(float(value)):
            raise _error(config, f"keep ratio must be in (0, 1], got {value}", "keep_ratio")
        object.__setattr__(config, "keep_ratio", float(value))
        if config.keep_growth is not None:  # 0: a fixed budget past growth_from
            object.__setattr__(config, "keep_growth", _require_share(config, "keep_growth", zero=True))
    _require_int(config, "growth_from", 1)


def _check_deep_keep(config: Any) -> None:
    """SpecPrefillConfig.deep_keep and deep_from: a share, and deeper layers to read it (deep_from,
    or layers first-K / first-F: the layers past the scored ones)."""
    if config.deep_from is not None:
        if config.deep_keep is None:
            raise _error(config, "deep_from needs deep_keep (the share its layers read)", "deep_from", "deep_keep")
        value = config.deep_from
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not number or value <= 0 or (value >= 1 and value != int(value)):
            raise _error(
                config,
                f"deep_from must be a layer index K >= 1 or a share of the layers in (0, 1), got {value!r}",
                "deep_from",
            )
        object.__setattr__(config, "deep_from", int(value) if value >= 1 else float(value))
    if config.deep_keep is None:
        return
    _require_share(config, "deep_keep")
    if config.deep_from is None and not str(config.layers).strip().lower().startswith("first-"):
        raise _error(
            config,
            "deep_keep needs deep_from or layers first-K / first-F (the layers past them read the share), "
            f"got layers {config.layers!r}",
            "deep_keep",
            "layers",
        )
