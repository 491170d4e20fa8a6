"""`specfill` command line: one module per subcommand, one-line errors, exit code 2 on bad input."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator, NoReturn, Sequence

from specfill.api import DEFAULT_BACKEND_RULE
from specfill.core import SpecfillError, SpecfillWarning
from specfill.core.cpu import command_threads
from specfill.core.errors import one_line

# name -> one-line help. A subcommand's module (cli/<name>.py: add_arguments, run) is imported only
# when that subcommand runs, so `specfill generate` loads neither evaluation, conformance nor serve.
SUBCOMMANDS = {
    "generate": "generate text (default model: the bundled SmolLM2-135M-Instruct demo)",
    "bench": "time-to-first-token and decode speed vs prompt length (JSON + Markdown + PNG)",
    "eval": (
        "perplexity, passkey retrieval and RULER's tasks per method and setting (JSON + Markdown + PNG: "
        "speed-up vs quality trade-off, map of kept positions)"
    ),
    "parity": "compare two backends: logits, H2O memory sets, SpecPrefill kept tokens, text (JSON + Markdown)",
    "conformance": "check a backend's stages against the reference; writes JSON + Markdown reports",
    "doctor": (
        "check this machine for specfill (versions, devices, kernels vs twins, a TTFT micro-bench); JSON + Markdown"
    ),
    "serve": "serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions)",
}


THREADS_HELP = "CPU threads for torch (the cuda backend on CPU; default: this machine's physical cores)"


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line on stderr and exit code 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"specfill: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; only the subcommand named in `argv` (if any) has its module imported and its options."""
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    parser = OneLineParser(
        prog="specfill",
        description="Faster time-to-first-token for long prompts: H2O and speculative prefill.",
        epilog=f"Default backend: {DEFAULT_BACKEND_RULE}; --backend overrides.",
    )
    parser.add_argument("--verbose", action="store_true", help="show tracebacks and details")
    parser.add_argument("--threads", "-t", type=int, default=None, help=THREADS_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for name, help_text in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and details"
        )
        sub.add_argument("--threads", "-t", type=int, default=argparse.SUPPRESS, help=THREADS_HELP)
        if name == chosen:
            module = importlib.import_module(f"specfill.cli.{name}")
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"specfill: warning: {one_line(str(message))}", file=sys.stderr)


def set_cpu_threads(threads: int) -> None:
    """torch's intra-op thread count now (a command that loads no model computes on it too); MLX's
    CPU backend and BLAS choose their own."""
    try:
        import torch
    except ImportError:
        return  # an MLX-only install: nothing to set
    torch.set_num_threads(threads)


@contextmanager
def threads_for(threads: int | None) -> Iterator[None]:
    """The command's CPU threads (core/cpu.command_threads: --threads, else the physical cores, which
    the torch backend applies when it loads on the CPU); torch's count before the command is back
    after it (a process that runs several commands, such as the tests, keeps its own setting)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        with command_threads(threads):
            if threads is not None:
                set_cpu_threads(threads)
            yield
    finally:
        if before is not None:
            torch.set_num_threads(before)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    if not args.verbose:
        warnings.showwarning = _one_line_warning
        warnings.simplefilter("default", SpecfillWarning)
    try:
        with threads_for(args.threads):
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
