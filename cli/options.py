"""Options shared by several subcommands: method settings and list parsing."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from specfill.api import DEFAULT_BACKEND_RULE, Session
from specfill.api import open as open_session
from specfill.core import ConfigError, H2OConfig, SpecfillWarning, SpecPrefillConfig
from specfill.core.config import DEFAULT_KEEP_RATIO, KEEP_RULES
from specfill.core.io.random_model import RANDOM_SHAPES
from specfill.core.request import Setting, settings_of
from specfill.core.runtime import SamplingConfig
from specfill.core.sampling import HOST_FIELDS

MODEL_HELP = (
    "GGUF file or model directory (default: the demo model); a Hugging Face repo id owner/repo, "
    "owner/repo:FILE.gguf or owner/repo:QUANT (e.g. :Q4_K_M), looked up in the local Hugging Face "
    "cache; random:SHAPE for random weights of a known shape (" + ", ".join(RANDOM_SHAPES) + ")"
)

BACKEND_HELP = f"mlx, or cuda (also called torch) (default: {DEFAULT_BACKEND_RULE})"


def str_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _number_list(text: str, kind: type, what: str) -> list:
    try:
        return [kind(item) for item in str_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of {what}, got {text!r}") from None


def int_list(text: str) -> list[int]:
    return _number_list(text, int, "integers")


def float_list(text: str) -> list[float]:
    return _number_list(text, float, "numbers")


# eval's sweeps: these settings take comma lists there, one evaluated variant each (as --keeps does for keep ratios)
SWEPT = (("H2OConfig", "dense_tail"), ("SpecPrefillConfig", "layers"))
MASS_RULE = ("keep_mass", "mass_floor", "mass_ceiling")
KEEP_FLAG = "--keep"  # SpecPrefillConfig.keep_ratio and .keep_tokens: parse_keep tells them apart
KEEP_HELP = (
    f"SpecPrefill keep: a ratio in (0, 1] or a token budget > 1 (default: ratio {DEFAULT_KEEP_RATIO}; "
    f"the paper's 0.1 loses multi-hop answers: docs/eval.md)"
)


def _dest(setting: Setting) -> str:
    """The argparse attribute of a setting's flags (argparse's own rule: the first long flag)."""
    return setting.cli[0].lstrip("-").replace("-", "_")


def add_config_options(
    p: argparse.ArgumentParser, config: type, sweep: bool = False, only: tuple[str, ...] | None = None
) -> None:
    """One flag per field of `config` that the CLI offers (core/request.SETTINGS: names, defaults, help);
    `only`: those fields alone. With `sweep` (eval) the SWEPT settings take comma lists."""
    for setting in settings_of(config):
        if not setting.cli or (only is not None and setting.field not in only):
            continue
        if setting.cli[0] == KEEP_FLAG:
            if setting.field == "keep_ratio":  # one flag for the ratio and the budget
                p.add_argument(KEEP_FLAG, default=None, help=KEEP_HELP)
        elif sweep and (setting.config, setting.field) in SWEPT:
            add_setting_option(
                p,
                setting,
                type=str_list if setting.kind is str else int_list,
                default=[setting.default],
                help=f"{setting.help} (comma list, one variant each)",
            )
        else:
            add_setting_option(p, setting)


def add_setting_option(p: argparse.ArgumentParser, setting: Setting, **overrides: Any) -> None:
    """The flag of one setting: its names, type, default and help from the table; `overrides`
    (argparse keywords) where a command reads it otherwise (--num-draft-tokens: none given, no drafting)."""
    options = {
        "type": setting.kind if setting.kind in (int, float) else None,
        "default": setting.default,
        "help": setting.help,
        **overrides,
    }
    if options["default"] is not None:
        options["help"] += " (default: %(default)s)"
    p.add_argument(*setting.cli, **options)


def add_method_options(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The H2O and SpecPrefill settings (every field core/request.SETTINGS gives a flag); with `sweep`
    (eval) the dense tail and the scoring layers take comma lists, one evaluated variant each."""
    add_config_options(p, H2OConfig, sweep)
    add_config_options(p, SpecPrefillConfig, sweep)


def parse_keep(text: str) -> dict:
    """'0.1' -> ratio, '1' / '1.0' -> ratio 1.0, '512' -> a 512-token budget."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--keep must be a number, got {text!r}") from None
    if value > 1 and value.is_integer():
        return {"keep_tokens": int(value)}
    return {"keep_ratio": value}


def _config_values(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """config's fields given by their flags (the keep flag and unset optional ones left out)."""
    values = {}
    for setting in settings_of(config):
        if setting.cli and setting.cli[0] != KEEP_FLAG:
            value = getattr(args, _dest(setting))
            if value is not None or not setting.optional:
                values[setting.field] = value
    return values


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--backend and --model, as every command that loads one model takes them."""
    p.add_argument("--backend", default=None, help=BACKEND_HELP)  # the platform rule, as every command
    p.add_argument("--model", default=None, help=MODEL_HELP)


def open_model(args: argparse.Namespace, **more: Any) -> Session:
    """The session of the model flags (--model, --backend, --device, --dtype, --pipeline): the backend
    and device rules, mlx.launch's ranks, the model; a device notice goes to standard error. `more`:
    specfill.api.open's other keywords, from a command's own flags."""
    return open_session(
        args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        pipeline=args.pipeline,
        notify=lambda notice: print(f"specfill: {notice}", file=sys.stderr),
        **more,
    )


def plan_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The plan fields the bench-like commands read alike from their flags: the model, its speculator,
    the methods' settings and the dtype."""
    return {
        "model": args.model,
        "speculator": args.speculator,
        "h2o": h2o_config(args),
        "specprefill": specprefill_config(args),
        "dtype": args.dtype,
    }


def h2o_config(args: argparse.Namespace, **overrides) -> H2OConfig:
    return H2OConfig(**{**_config_values(args, H2OConfig), **overrides})


def specprefill_config(args: argparse.Namespace, **overrides) -> SpecPrefillConfig:
    settings = _config_values(args, SpecPrefillConfig)  # keep_mass and its bounds when given
    if set(KEEP_RULES) & overrides.keys():  # the override replaces the keep rule the flags give
        settings = {k: v for k, v in settings.items() if k not in MASS_RULE}
    elif args.keep is not None:
        settings |= parse_keep(args.keep)  # SpecPrefillConfig's one check names a conflict with --keep-mass
    return SpecPrefillConfig(**{**settings, **overrides})


def _method_flags(method: str) -> tuple[str, ...]:
    """The argparse attributes of the flags only `method` reads."""
    configs = {"h2o": (H2OConfig,), "specprefill": (SpecPrefillConfig,)}[method]
    dests = tuple(_dest(s) for config in configs for s in settings_of(config) if s.cli)
    return dests + (("speculator",) if method == "specprefill" else ())


def warn_unused_options(args: argparse.Namespace, defaults: argparse.Namespace) -> None:
    """One warning naming the options given (not at their defaults) that `args.method` ignores: another
    method's; with auto, which weighs H2O always and SpecPrefill with a speculator (core/probe.auto_options),
    SpecPrefill's where no --speculator is given."""
    if args.method == "auto":
        ignored, method = () if args.speculator is not None else ("specprefill",), "auto without --speculator"
    else:
        ignored, method = tuple(m for m in ("h2o", "specprefill") if m != args.method), args.method
    unused = [
        f"--{name.replace('_', '-')}"
        for ignoring in ignored
        for name in dict.fromkeys(_method_flags(ignoring))
        if getattr(args, name) != getattr(defaults, name)
    ]
    if unused:
        warnings.warn(
            f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing with --method {method}",
            SpecfillWarning,
            stacklevel=2,
        )


def add_sampling_options(p: argparse.ArgumentParser, basic: bool = False) -> None:
    """--top-k, --min-p and the penalties (core/sampling.py; llama.cpp's and mlx-lm's flag names);
    with `basic` also --temp, --top-p and --seed (core/request.SETTINGS: SamplingConfig's flags)."""
    add_config_options(p, SamplingConfig, only=None if basic else HOST_FIELDS)


def sampling_options(args: argparse.Namespace) -> dict:
    """The add_sampling_options values as stream_generate keywords."""
    return {field: getattr(args, field) for field in HOST_FIELDS}
