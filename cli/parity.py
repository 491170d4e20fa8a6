"""`specfill parity --backends mlx,cuda`: the same weights and prompt on two backends."""

from __future__ import annotations

import argparse

from specfill.core import ConfigError
from specfill.evaluation.parity import ParityPlan, run_parity, write_parity

from .options import MODEL_HELP, add_method_options, plan_settings, str_list


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", type=str_list, default=["mlx", "cuda"], help="two backends (default: mlx,cuda)")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--speculator", default="self:8")
    p.add_argument("--generate-tokens", type=int, default=24)
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--out", default="results/parity")
    p.add_argument("--name", default="parity")
    add_method_options(p)
    p.set_defaults(chunk_size=128, batch_size=256, h2o_local=32, h2o_heavy=32, keep="0.3")


def run(args: argparse.Namespace) -> int:
    if len(args.backends) != 2 or args.backends[0] == args.backends[1]:
        raise ConfigError(f"--backends takes two different backends, got {','.join(args.backends)}")
    if args.prompt_tokens < 2 or args.generate_tokens < 1:
        raise ConfigError("--prompt-tokens must be >= 2 and --generate-tokens >= 1")
    plan = ParityPlan(
        backends=tuple(args.backends),
        prompt_tokens=args.prompt_tokens,
        generate_tokens=args.generate_tokens,
        **plan_settings(args),
    )
    for path in write_parity(run_parity(plan), args.out, args.name):
        print(path)
    return 0
