"""Options shared by several subcommands: method settings and list parsing."""
from __future__ import annotations

import argparse
import warnings

from specfill.api import DEFAULT_BACKEND_RULE
from specfill.core import ConfigError, H2OConfig, SpecfillWarning, SpecPrefillConfig
from specfill.core.config import DEFAULT_KEEP_RATIO, MASS_CEILING, MASS_FLOOR
from specfill.core.io.random_model import RANDOM_SHAPES


MODEL_HELP = ("GGUF file or model directory (default: the demo model); a Hugging Face repo id owner/repo, "
              "owner/repo:FILE.gguf or owner/repo:QUANT (e.g. :Q4_K_M), looked up in the local Hugging Face "
              "cache; random:SHAPE for random weights of a known shape (" + ", ".join(RANDOM_SHAPES) + ")")

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


def add_method_options(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The H2O and SpecPrefill settings; with `sweep` (eval) the dense tail and the scoring
    layers take comma lists, one evaluated variant each (as --keeps does for keep ratios)."""
    p.add_argument("--chunk-size", "-ub", type=int, default=H2OConfig.chunk_size, help="H2O chunk size S")
    p.add_argument("--batch-size", "-b", type=int, default=H2OConfig.batch_size, help="H2O logical batch B")
    p.add_argument("--h2o-local", type=int, default=H2OConfig.local, help="H2O local window L")
    p.add_argument("--h2o-heavy", type=int, default=H2OConfig.heavy, help="H2O heavy hitters H")
    tail_help = ("H2O dense tail W: the last W prompt tokens attend to every prompt key (0 = seed 001's "
                 "method exactly; default %(default)s)")
    layers_help = ("SpecPrefill scoring layers of the speculator: all (the paper's max over every layer), "
                   "last-K (a window of K layers ending at its last) or last-1 (the last only); default: "
                   f"{SpecPrefillConfig.layers}")
    if sweep:
        p.add_argument("--h2o-dense-tail", type=int_list, default=[H2OConfig.dense_tail],
                       help=tail_help.replace("W:", "W (comma list, one H2O variant each):"))
        p.add_argument("--score-layers", type=str_list, default=[SpecPrefillConfig.layers],
                       help=layers_help + " (comma list, one SpecPrefill variant each)")
    else:
        p.add_argument("--h2o-dense-tail", type=int, default=H2OConfig.dense_tail, help=tail_help)
        p.add_argument("--score-layers", default=SpecPrefillConfig.layers, help=layers_help)
    p.add_argument("--keep", default=None,
                   help=f"SpecPrefill keep: a ratio in (0, 1] or a token budget > 1 (default: ratio {DEFAULT_KEEP_RATIO}; "
                        f"the paper's 0.1 loses multi-hop answers: docs/eval.md)")
    p.add_argument("--lookahead", type=int, default=SpecPrefillConfig.lookahead)
    p.add_argument("--pool-kernel", type=int, default=SpecPrefillConfig.pool_kernel)
    p.add_argument("--select-chunk", type=int, default=SpecPrefillConfig.select_chunk)
    p.add_argument("--h2o-layers", default=H2OConfig.layers,
                   help="H2O: the layers that run it (all, first-K, last-K, first-F, last-F with F a share); the "
                        "others attend to every key")
    p.add_argument("--h2o-memory-share", type=float, default=None,
                   help="H2O memory L+H as this share of the prompt (split L:H as given, below S); default: fixed L, H")
    p.add_argument("--lookahead-reduction", default=SpecPrefillConfig.lookahead_reduction,
                   help="SpecPrefill: mean (paper) or max over the look-ahead queries' scores")
    p.add_argument("--keep-mass", type=float, default=None,
                   help="SpecPrefill importance-mass rule (replaces --keep): the fewest chunks holding this share "
                        "of the speculator's attention mass, within --mass-floor and --mass-ceiling of the chunks")
    p.add_argument("--mass-floor", type=float, default=None,
                   help=f"with --keep-mass: keep at least this share of the chunks (default {MASS_FLOOR})")
    p.add_argument("--mass-ceiling", type=float, default=None,
                   help=f"with --keep-mass: keep at most this share of the chunks (default {MASS_CEILING})")
    p.add_argument("--neighbours", type=int, default=SpecPrefillConfig.neighbours,
                   help="SpecPrefill: also keep this many chunks each side of every selected chunk")
    p.add_argument("--layer-reduction", default=SpecPrefillConfig.layer_reduction,
                   help="SpecPrefill: mean or max over the speculator's scoring layers")
    p.add_argument("--head-reduction", default=SpecPrefillConfig.head_reduction,
                   help="SpecPrefill: mean or max over the speculator's attention heads")
    p.add_argument("--token-floor", type=int, default=SpecPrefillConfig.token_floor,
                   help="SpecPrefill: keep at least this many tokens whatever the keep rule says")
    p.add_argument("--keep-first", type=int, default=SpecPrefillConfig.keep_first,
                   help="SpecPrefill: always keep the prompt's first N tokens (on top of the budget)")
    p.add_argument("--keep-last", type=int, default=SpecPrefillConfig.keep_last,
                   help="SpecPrefill: always keep the prompt's last N tokens (on top of the budget)")


# SpecPrefillConfig's scoring and selection settings an option sets by their own names (--layer-reduction ...)
SELECTION_OPTIONS = ("lookahead_reduction", "layer_reduction", "head_reduction", "neighbours", "token_floor",
                     "keep_first", "keep_last")


def parse_keep(text: str) -> dict:
    """'0.1' -> ratio, '1' / '1.0' -> ratio 1.0, '512' -> a 512-token budget."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--keep must be a number, got {text!r}") from None
    if value > 1 and value.is_integer():
        return {"keep_tokens": int(value)}
    return {"keep_ratio": value}


def h2o_config(args: argparse.Namespace, **overrides) -> H2OConfig:
    settings = {"dense_tail": args.h2o_dense_tail, "memory_share": args.h2o_memory_share,
                "layers": args.h2o_layers, **overrides}
    return H2OConfig(args.chunk_size, args.batch_size, args.h2o_local, args.h2o_heavy, **settings)


def specprefill_config(args: argparse.Namespace, **overrides) -> SpecPrefillConfig:
    given = {} if args.keep is None else parse_keep(args.keep)
    mass = {"keep_mass": args.keep_mass, "mass_floor": args.mass_floor, "mass_ceiling": args.mass_ceiling}
    given |= {k: v for k, v in mass.items() if v is not None}  # SpecPrefillConfig's one check names a conflict
    keep = {} if {"keep_ratio", "keep_tokens", "keep_mass"} & overrides.keys() else given
    settings = {"layers": args.score_layers, **{name: getattr(args, name) for name in SELECTION_OPTIONS},
                **keep, **overrides}
    return SpecPrefillConfig(lookahead=args.lookahead, pool_kernel=args.pool_kernel,
                             select_chunk=args.select_chunk, **settings)


_METHOD_OPTIONS = {"h2o": ("chunk_size", "batch_size", "h2o_local", "h2o_heavy", "h2o_dense_tail", "h2o_memory_share",
                           "h2o_layers"),
                   "specprefill": ("keep", "lookahead", "pool_kernel", "select_chunk", "speculator", "score_layers",
                                   "keep_mass", "mass_floor", "mass_ceiling", *SELECTION_OPTIONS)}


def warn_unused_options(args: argparse.Namespace, defaults: argparse.Namespace) -> None:
    """One warning naming the options given (not at their defaults) that `args.method` ignores."""
    unused = [f"--{name.replace('_', '-')}" for method, names in _METHOD_OPTIONS.items() if method != args.method
              for name in names if getattr(args, name) != getattr(defaults, name)]
    if unused:
        warnings.warn(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing with --method "
                      f"{args.method}", SpecfillWarning, stacklevel=2)


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """--top-k, --min-p and the penalties (core/sampling.py; llama.cpp's and mlx-lm's flag names)."""
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than min_p times the most likely (default 0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide a positive logit (multiply a negative one) of a token among the last 64 by this "
                        "(default 1: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract from the logit of a token among the last 64 (default 0: off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this times its count among the last 64 from a token's logit (default 0: off)")


def sampling_options(args: argparse.Namespace) -> dict:
    """The add_sampling_options values as stream_generate keywords."""
    return {"top_k": args.top_k, "min_p": args.min_p, "repetition_penalty": args.repetition_penalty,
            "presence_penalty": args.presence_penalty, "frequency_penalty": args.frequency_penalty}
