"""`specfill doctor`: what this machine offers specfill, whether its kernels agree with their twins,
and a short TTFT micro-bench, as one JSON + Markdown report a user attaches to an issue.

Sections: environment (versions, device, memory, BLAS, Metal / CUDA / Triton availability);
kernels (the conformance suite with the backend's custom kernels forced, or the reason it cannot
run here), on a Mac the Metal kernel matrix on real Metal, and the first-use self-checks the
micro-bench triggered; micro-bench (full / H2O / SpecPrefill TTFT on a random-weight model at a
few prompt lengths) with the roofline model's prediction from this machine's measured rates.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from specfill.backends import get_backend
from specfill.core import H2OConfig, SpecPrefillConfig

from .machine import describe_machine

PACKAGES = (
    "specfill",
    "numpy",
    "torch",
    "triton",
    "mlx",
    "mlx-metal",
    "mlx-cpu",
    "mlx-lm",
    "gguf",
    "tokenizers",
    "safetensors",
    "transformers",
    "huggingface-hub",
)


@dataclass(frozen=True)
class DoctorPlan:
    """backend: "mlx" or "cuda". The micro-bench: `model` (random:SHAPE) at `lengths` tokens,
    H2O at its defaults, SpecPrefill with the model's first layer as speculator (self:1)."""

    backend: str
    model: str = "random:tiny-llama-32k"
    lengths: tuple[int, ...] = (4000, 16000)
    methods: tuple[str, ...] = ("full", "h2o", "specprefill")
    speculator: str = "self:1"
    run_kernel_conformance: bool = True


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_facts() -> dict[str, Any]:
    """CUDA, Triton and BLAS as torch sees them (nothing when torch is not installed)."""
    return get_backend("cuda").facts() if _installed("torch") else {"installed": False}


def mlx_facts() -> dict[str, Any]:
    """Metal, the device and the BLAS MLX's CPU backend uses (nothing when MLX is not installed)."""
    return get_backend("mlx").facts() if _installed("mlx") else {"installed": False}


def environment() -> dict[str, Any]:
    """Machine, package versions, available memory, BLAS, and the torch / MLX facts."""
    import numpy as np

    try:
        numpy_blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    except TypeError:  # NumPy before 1.26 prints its configuration and takes no mode
        numpy_blas = {}
    try:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        available = None
    return {
        "machine": describe_machine(),
        "packages": {p: _version(p) for p in PACKAGES},
        "memory_available_gb": None if available is None else round(available, 1),
        "numpy_blas": f"{numpy_blas.get('name', 'unknown')} {numpy_blas.get('version', '')}".strip(),
        "torch": torch_facts(),
        "mlx": mlx_facts(),
    }


def kernel_skip_reason(backend: str, env: dict[str, Any]) -> str | None:
    """Why the backend's custom kernels cannot be forced here, or None when they can."""
    if backend == "mlx":
        if not env["mlx"]["installed"]:
            return "MLX is not installed"
        return None if env["mlx"]["metal_available"] else "no Metal device (this MLX is its CPU build)"
    facts = env["torch"]
    if not facts["installed"]:
        return "torch is not installed"
    reason = facts["triton_kernels_unavailable"]
    if reason is not None and not facts["cuda_available"] and _installed("triton"):
        return f"no CUDA GPU (torch {_version('torch')} sees none); TRITON_INTERPRET=1 runs the kernels on CPU"
    return reason


def kernel_conformance(backend: str, env: dict[str, Any]) -> dict[str, Any]:
    """The conformance suite with kernels forced, or {"skipped": reason}."""
    reason = kernel_skip_reason(backend, env)
    if reason is not None:
        return {"skipped": reason}
    from specfill.conformance import run_conformance

    report = run_conformance(backend, None, use_kernels=True)
    return {
        "passed": report.passed,
        "checks": len(report.results),
        "failed": len(report.failures),
        "seconds": round(report.seconds, 1),
        "dtypes": list(report.dtypes),
        "failures": [f"{f.check} [{f.dtype}] {f.case}: {f.detail}" for f in report.failures[:20]],
    }


def micro_bench(plan: DoctorPlan, log: Callable[[str], None]) -> dict[str, Any]:
    """TTFT of each method at each length on the plan's model (evaluation.bench, 2 decode tokens)."""
    from .bench import BenchPlan, run_bench

    bench = BenchPlan(
        backends=(plan.backend,),
        methods=plan.methods,
        lengths=plan.lengths,
        model=plan.model,
        speculator=plan.speculator,
        h2o=H2OConfig(),
        specprefill=SpecPrefillConfig(),
        decode_tokens=2,
        repeats=1,
    )
    result = run_bench(bench, log=log)
    return {"plan": result["plan"], "rows": result["rows"], "calibration": result["calibration"]}


def roofline_prediction(plan: DoctorPlan, bench: dict[str, Any]) -> dict[str, Any]:
    """The roofline formula (evaluation/roofline.py) with this machine's measured GEMM / attention /
    copy rates on the bench model's shapes, beside each measured TTFT; {"skipped": reason} when
    the bench did not run or its model's shape is not known without loading it (a path)."""
    from specfill.core.io.random_model import is_random_model, random_model_args

    from .roofline import Shape, predict_bench_rows

    if "skipped" in bench:
        return {"skipped": "no micro-bench ran"}
    if not is_random_model(plan.model):
        return {"skipped": "the prediction needs the bench model's shape: only random:SHAPE models give it"}
    shape = Shape.from_args(plan.model, random_model_args(plan.model))
    context = min(max(plan.lengths), 4096)
    if plan.backend == "mlx":  # random weights are float32, which MLX keeps on Metal and CPU
        from .rates import mlx_rates

        rates, width = mlx_rates(shape, "float32", context=context), 4
    else:  # the torch backend's default: bfloat16 on CUDA, float32 on CPU (where it falls back to the CPU)
        from .rates import torch_rates

        cuda = get_backend("cuda").cpu_fallback(None) is None
        rates = torch_rates(shape, "cuda" if cuda else "cpu", "bfloat16" if cuda else "float32", context=context)
        width = 2 if cuda else 4
    rows = predict_bench_rows(
        shape, rates, bench["rows"], plan.speculator, width, H2OConfig(), SpecPrefillConfig().lookahead
    )
    return {"rates": vars(rates), "rows": rows}


def metal_matrix(backend: str, env: dict[str, Any]) -> dict[str, Any]:
    """On a Mac (backend mlx, Metal present): every Metal kernel cell against its twin on real
    Metal (backends/mlx/kernels/matrix.py), the checks the C++ emulation cannot make; elsewhere
    {"skipped": reason}."""
    if backend != "mlx":
        return {"skipped": "the Metal matrix is the mlx backend's check"}
    reason = kernel_skip_reason(backend, env)
    if reason is not None:
        return {"skipped": f"{reason}; scripts/metal_matrix.py runs it through the C++ emulation"}
    result = get_backend("mlx").kernel_matrix()
    if result is None:  # (the mlx backend always has its matrix)
        return {"skipped": "the mlx backend has no Metal matrix"}
    return {
        "cells": len(result["cells"]),
        "failures": result["failures"],
        "device": result["device"],
        "failed": [f"{r['cell']}: {'; '.join(r['failures'])}" for r in result["cells"] if r["failures"]][:20],
    }


def run_doctor(plan: DoctorPlan, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every section in order; the self-check verdicts are read after the bench triggered them."""
    from specfill.core.self_check import KERNEL_SELF_CHECK, kernels_setting, kernels_word

    start = time.perf_counter()
    env = environment()
    log("doctor: environment read")
    kernels = (
        kernel_conformance(plan.backend, env)
        if plan.run_kernel_conformance
        else {"skipped": "not asked (--no-kernel-check)"}
    )
    log(f"doctor: kernels {'skipped: ' + kernels['skipped'] if 'skipped' in kernels else 'checked'}")
    metal = (
        metal_matrix(plan.backend, env) if plan.run_kernel_conformance else {"skipped": "not asked (--no-kernel-check)"}
    )
    bench = micro_bench(plan, log) if plan.lengths else {"skipped": "no lengths asked"}
    prediction = roofline_prediction(plan, bench)
    checks = [vars(v) | {"passed": v.passed} for v in KERNEL_SELF_CHECK.verdicts()]
    return {
        "backend": plan.backend,
        "kernels_setting": kernels_word(kernels_setting(None)),
        "environment": env,
        "kernel_conformance": kernels,
        "metal_matrix": metal,
        "self_checks": checks,
        "micro_bench": bench,
        "roofline": prediction,
        "seconds": round(time.perf_counter() - start, 1),
    }
