"""`specfill` command line: one module per subcommand, one-line errors, exit code 2 on bad input."""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Sequence

from specfill.core import SpecfillError, SpecfillWarning

from . import bench, conformance, eval, generate, parity

SUBCOMMANDS = {"generate": generate, "bench": bench, "eval": eval, "parity": parity, "conformance": conformance}


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line on stderr and exit code 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"specfill: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="specfill", description="Faster time-to-first-token for long prompts: H2O and speculative prefill.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks and details")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=OneLineParser)
    for name, module in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        sub.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks and details")
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"specfill: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.verbose:
        warnings.showwarning = _one_line_warning
        warnings.simplefilter("default", SpecfillWarning)
    try:
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
