"""The candidates of `specfill eval --candidates` (evaluation/ruler_protocol.py): the settings a
selection protocol run compares, parsed from "NAME:key=value,..." words."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig
from specfill.core.config import speculator_h2o
from specfill.core.runtime import COMPOSED

Setting = SpecPrefillConfig | H2OConfig | None  # None: full prefill
H2O_PREFIX = "h2o_"  # a SpecPrefill candidate's key setting its speculator's H2OConfig field


def parse_candidate(text: str) -> tuple[str, Setting]:
    """ "NAME:key=value,..." -> (NAME, setting): NAME "full" is full prefill, a NAME starting with
    "h2o" an H2OConfig, any other a SpecPrefillConfig; values are ints, floats or words ("mean");
    "NAME:" (or "NAME") is that method's default; a NAME containing "+h2o" (specprefill+h2o) is
    SpecPrefill over an H2O speculator (speculator_prefill=h2o unless given). In a SpecPrefill
    candidate, keys "h2o_FIELD" set the speculator's H2OConfig FIELD (speculator_h2o(FIELD=...):
    "c+h2o:h2o_layers=last-0.67,h2o_memory_share=0.1") and make it a composition. A bad key or value
    is one ConfigError."""
    name, _, body = text.partition(":")
    name = name.strip()
    if not name:
        raise ConfigError(f"candidate {text!r}: give a name before ':'")
    fields: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"candidate {name!r}: {item!r} is not key=value")
        for cast in (int, float, str):
            try:
                fields[key.strip()] = cast(value.strip())
                break
            except ValueError:
                continue
    if name == "full":
        if fields:
            raise ConfigError("candidate 'full' takes no settings")
        return name, None
    kind = H2OConfig if name.startswith("h2o") else SpecPrefillConfig
    speculator = {k.removeprefix(H2O_PREFIX): fields.pop(k) for k in list(fields) if k.startswith(H2O_PREFIX)}
    if speculator and kind is H2OConfig:
        raise ConfigError(f"candidate {name!r}: {H2O_PREFIX}* keys set a SpecPrefill speculator's H2O, not H2O's")
    if speculator and fields.get("speculator_prefill", "h2o") != "h2o":
        raise ConfigError(f"candidate {name!r}: {H2O_PREFIX}* keys need speculator_prefill=h2o")
    if "+h2o" in name or speculator:
        fields.setdefault("speculator_prefill", "h2o")
    try:
        if speculator:
            fields["speculator_prefill"] = speculator_h2o(**speculator)
        return name, kind(**fields)
    except TypeError as err:
        raise ConfigError(f"candidate {name!r}: {err}") from None


def on_saved_pass(setting: Setting, selection_only: bool = False) -> bool:
    """A SpecPrefill candidate scored on the sample's saved speculator pass (ruler_passes.pass_path:
    one per speculator prefill). SpecPrefill over an H2O speculator is scored on its saved H2O pass
    in a selection-only run, and decoded end to end through the API (its speculator pass timed in
    the call), as H2O and full are. A nested speculator (deep_keep) never is: a saved pass is the
    whole speculator's, and its selection needs its own pass (decoded end to end)."""
    if not isinstance(setting, SpecPrefillConfig) or setting.deep_keep is not None:
        return False
    return setting.speculator_prefill is None or selection_only


def selected_alone(setting: Setting) -> bool:
    """A candidate whose kept set a selection-only run measures without the main model: every
    SpecPrefill candidate on a saved pass (dense or H2O); full, H2O and a nested speculator decode
    or nothing."""
    return on_saved_pass(setting, selection_only=True)


def method_name(setting: Setting) -> str:
    """The method a candidate runs, as records and statistics name it."""
    if setting is None:
        return "full"
    if isinstance(setting, H2OConfig):
        return "h2o"
    return COMPOSED if setting.speculator_prefill is not None else "specprefill"


def default_candidates() -> dict[str, Setting]:
    """Full prefill and each sparse method at its current default."""
    return {"full": None, "h2o": H2OConfig(), "specprefill": SpecPrefillConfig()}


def candidate_grid() -> dict[str, Setting]:
    """The selection candidates (issue 34): the paper's scoring (max over layers) and layer-mean
    scoring at several budgets, a token floor, always-kept boundary spans, neighbours, skipping
    the speculator's first layers, and the adaptive (importance-mass) budget."""
    paper = {f"max {r}": SpecPrefillConfig(keep_ratio=r, layer_reduction="max") for r in (0.1, 0.2, 0.3)}
    mean = {f"mean {r}": SpecPrefillConfig(keep_ratio=r, layer_reduction="mean") for r in (0.1, 0.15, 0.2, 0.25, 0.3)}
    base = SpecPrefillConfig(keep_ratio=0.15, layer_reduction="mean")
    grid: dict[str, Setting] = {**paper, **mean}
    grid["mean 0.15 floor1024"] = replace(base, token_floor=1024)
    grid["mean 0.15 edges64"] = replace(base, keep_first=64, keep_last=64)
    grid["mean 0.15 last256"] = replace(base, keep_last=256)
    grid["mean 0.1 nb1"] = SpecPrefillConfig(keep_ratio=0.1, layer_reduction="mean", neighbours=1)
    grid["mean 0.15 skip-first-third"] = replace(base, layers="last-16")
    grid["mean 0.2 head-mean"] = SpecPrefillConfig(keep_ratio=0.2, layer_reduction="mean", head_reduction="mean")
    grid["mean 0.2 la-max"] = SpecPrefillConfig(keep_ratio=0.2, layer_reduction="mean", lookahead_reduction="max")
    for p in (0.5, 0.7):
        grid[f"mean mass {p} [0.1,0.3]"] = SpecPrefillConfig(
            keep_mass=p, mass_floor=0.1, mass_ceiling=0.3, layer_reduction="mean"
        )
    return grid


def resolve_candidates(specs: list[str]) -> dict[str, Setting]:
    """`--candidates` words: "defaults" (default_candidates), "grid" (candidate_grid), or specs."""
    out: dict[str, Setting] = {}
    for spec in specs:
        if spec == "defaults":
            out.update(default_candidates())
        elif spec == "grid":
            out.update(candidate_grid())
        else:
            name, setting = parse_candidate(spec)
            out[name] = setting
    return out
