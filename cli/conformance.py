"""`specfill conformance --backend NAME`: check a backend's stages against the NumPy reference."""

from __future__ import annotations

import argparse

from specfill.conformance import REGISTRY, TOLERANCES, run_conformance, write_reports
from specfill.core import ConfigError
from specfill.core.self_check import KERNEL_MODES, KERNELS_ENV, kernels_env, kernels_setting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", required=True, help=f"one of: {', '.join(REGISTRY)}")
    parser.add_argument(
        "--dtype",
        action="append",
        default=None,
        help=f"compute dtype to check (repeatable; {', '.join(TOLERANCES)}); default: the backend's usual dtypes",
    )
    parser.add_argument(
        "--kernels",
        choices=tuple(KERNEL_MODES),
        default=None,
        help="on: force the backend's custom kernels (Triton, Metal; TRITON_INTERPRET=1 "
        "runs Triton on CPU), off: its ops twins, auto: its dispatcher decides "
        f"(each kernel after a first-use self-check); default: ${KERNELS_ENV}, else auto",
    )
    parser.add_argument("--out", default="results/conformance", help="report folder (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    dtypes = [d for item in args.dtype or [] for d in item.split(",") if d] or None
    for dtype in dtypes or []:
        if dtype not in TOLERANCES:
            raise ConfigError(f"unknown dtype {dtype!r} (known: {', '.join(TOLERANCES)})")
    with kernels_env(args.kernels):  # the option and the variable are one setting; the option wins
        report = run_conformance(args.backend, dtypes, use_kernels=kernels_setting(None))
    json_path, md_path = write_reports(report, args.out)
    verdict = "PASS" if report.passed else "FAIL"
    print(
        f"conformance {args.backend} [{', '.join(report.dtypes)}; kernels {report.kernels}]: {verdict} — "
        f"{len(report.results) - len(report.failures)}/{len(report.results)} checks passed "
        f"in {report.seconds:.1f} s"
    )
    for failure in report.failures[:10]:
        print(f"  FAIL {failure.check} [{failure.dtype}] {failure.case}: {failure.detail}")
    if len(report.failures) > 10:
        print(f"  ... {len(report.failures) - 10} more in {md_path}")
    print(f"reports: {json_path} {md_path}")
    return 0 if report.passed else 1
