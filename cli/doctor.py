"""`specfill doctor`: environment, kernel-vs-twin conformance and a TTFT micro-bench in one report."""

from __future__ import annotations

import argparse

from specfill.api import DEFAULT_BACKEND_RULE, resolve_backend
from specfill.core import ConfigError
from specfill.evaluation.doctor import DoctorPlan, run_doctor
from specfill.evaluation.doctor_report import write_doctor

from .options import int_list


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None, help=f"mlx or cuda (default: {DEFAULT_BACKEND_RULE})")
    p.add_argument("--out", default="results/doctor", help="report folder (default: %(default)s)")
    p.add_argument(
        "--bench-model",
        default=DoctorPlan.model,
        help="random:SHAPE (or a model path) for the micro-bench (default: %(default)s)",
    )
    p.add_argument(
        "--bench-lengths",
        type=int_list,
        default=list(DoctorPlan.lengths),
        help="prompt lengths of the micro-bench (default: 4000,16000; empty: no bench)",
    )
    p.add_argument(
        "--no-kernel-check", action="store_true", help="skip the kernel-vs-twin conformance run (kernels forced)"
    )


def run(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend)
    if backend not in ("mlx", "cuda"):
        raise ConfigError(f"--backend must be mlx, cuda or torch, got {backend!r}")
    if any(n < 2 for n in args.bench_lengths):
        raise ConfigError("--bench-lengths must be at least 2 tokens each")
    plan = DoctorPlan(
        backend=backend,
        model=args.bench_model,
        lengths=tuple(args.bench_lengths),
        run_kernel_conformance=not args.no_kernel_check,
    )
    report = run_doctor(plan, log=lambda line: print(line, flush=True))
    paths = write_doctor(report, args.out)
    conformance = report["kernel_conformance"]
    metal = report["metal_matrix"]
    failed = ("skipped" not in conformance and not conformance["passed"]) or bool(metal.get("failures"))
    failed_checks = [c for c in report["self_checks"] if not c["passed"]]
    verdict = "FAIL" if failed else f"skipped ({conformance['skipped']})" if "skipped" in conformance else "PASS"
    if "skipped" not in metal:
        print(f"doctor {backend}: Metal matrix {metal['cells'] - metal['failures']}/{metal['cells']} cells pass")
    print(f"doctor {backend}: kernels {verdict}; {len(failed_checks)} self-check fallback(s); {report['seconds']} s")
    print(f"report: {' '.join(str(p) for p in paths)} — attach it to a bug report")
    return 1 if failed or failed_checks else 0
