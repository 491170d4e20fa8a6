"""`specfill` command line: one module per subcommand, one-line errors, exit code 2 on bad input."""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Sequence

from specfill.api import DEFAULT_BACKEND_RULE
from specfill.core import ConfigError, SpecfillError, SpecfillWarning

from . import bench, conformance, doctor, eval, generate, parity, serve

SUBCOMMANDS = {"generate": generate, "bench": bench, "eval": eval, "parity": parity, "conformance": conformance,
               "doctor": doctor, "serve": serve}


MAX_THREADS = 4096  # torch overflows past 2**31; no machine has more cores than this
THREADS_HELP = "CPU threads for torch (the cuda backend on CPU; default: torch's own choice)"


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line on stderr and exit code 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"specfill: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="specfill", description="Faster time-to-first-token for long prompts: H2O and speculative prefill.",
        epilog=f"Default backend: {DEFAULT_BACKEND_RULE}; --backend overrides.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks and details")
    parser.add_argument("--threads", "-t", type=int, default=None, help=THREADS_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=OneLineParser)
    for name, module in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        sub.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks and details")
        sub.add_argument("--threads", "-t", type=int, default=argparse.SUPPRESS, help=THREADS_HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"specfill: warning: {message}", file=sys.stderr)


def set_cpu_threads(threads: int) -> None:
    """torch's intra-op thread count; MLX's CPU backend and BLAS choose their own."""
    if not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be >= 1 and <= {MAX_THREADS}, got {threads}")
    try:
        import torch
    except ImportError:
        return  # an MLX-only install: nothing to set
    torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.verbose:
        warnings.showwarning = _one_line_warning
        warnings.simplefilter("default", SpecfillWarning)
    try:
        if args.threads is not None:
            set_cpu_threads(args.threads)
        return int(args.run(args))
    except SpecfillError as err:
        if args.verbose:
            raise
        print(f"specfill: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specfill: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
