"""A description of the machine a figure was measured on (written into every result file)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys

from specfill.core.cpu import compute_threads, has_fast_bf16
from specfill.core.cpu import cpu_features as _cpu_features
from specfill.core.cpu import cpu_model as _cpu_model


def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX on this CPU (core/cpu.py)."""
    return has_fast_bf16()


def default_eval_dtype(backend: str, device: str | None) -> str:
    """The dtype an evaluation runs in when none is given: bfloat16 on a GPU or on a CPU with fast
    bf16 matmuls (torch backend), float32 on any other CPU."""
    if backend == "cuda" and (device or "cpu").startswith("cpu"):
        import torch

        if device is None and torch.cuda.is_available():
            return "bfloat16"
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    return "float32" if backend == "mlx" and not _metal() else "bfloat16"


def _metal() -> bool:
    from specfill.api import mlx_metal_available

    return mlx_metal_available()


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_machine(extra: dict | None = None) -> dict:
    """CPU, cores, memory, OS, Python and framework versions; GPU name when torch sees one."""
    info = {
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_features": _cpu_features(),
        "cores": os.cpu_count(),
        "memory_gb": round(_memory_gb() or 0.0, 1),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("specfill", "numpy", "torch", "triton", "mlx", "mlx-lm", "transformers")},
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    try:  # other jobs on shared cores skew timings: say how busy the machine was (no Windows)
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    # torch's CPU threads: a CLI command's (core/cpu.compute_threads: what the torch backend sets when it
    # loads on the CPU, so a run described before its model loads says it too), else torch's own where
    # torch is in use; torch is never imported here
    torch = sys.modules.get("torch")
    threads = compute_threads() if importlib.util.find_spec("torch") is not None else None
    if threads is None and torch is not None:
        threads = torch.get_num_threads()
    if threads is not None:
        info["torch_threads"] = threads
    info.update(extra or {})
    return info


def timing_machine(info: dict) -> str:
    """What a time depends on, in one line: the CPU and its GEMM flags, torch's threads, the GPU. Two
    times compare (a speed-up) only when taken on the same one."""
    threads = f", {info['torch_threads']} thread(s)" if info.get("torch_threads") else ""
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ""
    return f"{info['cpu']} [{info.get('cpu_features', '?')}]{threads}{gpu}"


def machine_line(info: dict) -> str:
    """One line for Markdown reports."""
    return (
        f"{info['cpu']} [{info.get('cpu_features', '?')}] ({info['cores']} cores, {info['memory_gb']} GB), "
        f"{info['os']} {info['arch']}, "
        f"Python {info['python']}"
        + (f", GPU {info['gpu']}" if info.get("gpu") else "")
        + (f"; torch {info['torch_threads']} thread(s)" if info.get("torch_threads") else "")
        + (f"; load average {info['load_average_1min']}" if "load_average_1min" in info else "")
    )


def report_head(title: str, result: dict, done: str) -> list[str]:
    """A Markdown report's first lines: the title, a note that the run is partial (its finished `done`:
    rows, cells) while result["complete"] is False, and the machine line."""
    partial = (
        []
        if result.get("complete", True)
        else [f"Partial: the run has not finished (or was stopped); these are the {done} it completed.", ""]
    )
    return [f"# {title}", "", *partial, f"Machine: {machine_line(result['machine'])}."]
