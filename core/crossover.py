"""`method="auto"` decided on the machine it runs on: a measured crossover per machine, cached.

A crossover (the prompt length from which a sparse method's prefill beats full prefill) belongs
to one CPU / GPU, thread count, backend, device, dtype, model shape and method configuration:
H2O's CPU path and full prefill's SDPA ride different BLAS paths (AMX, AVX-512 BF16 or neither),
so a crossover measured on one machine can send `auto` to the slower method on another. So
`auto` never reads a file measured elsewhere: the first time a (machine, model shape, dtype,
method) is used with `auto`, `calibrated_crossover` times both prefills here (core/probe.py, a
few seconds) and caches the result as JSON under calibration_dir() with that machine
description; a cached file whose description differs from this machine's is measured again.
`specfill doctor` and `specfill bench` refresh it (`refresh=True`); `specfill bench
--save-crossover` stores the bench's own whole-model measurement instead (`save_calibration`).

The crossover is the shortest measured length L at which the sparse method was faster than full
prefill (by more than the probe's noise: FASTER_BELOW) at L and at every longer measured length
(None: it never was, and auto stays on full prefill). Prompts shorter than the shortest candidate
length run full prefill unmeasured; longer than the longest measured length, the verdict at the
longest holds. With several sparse methods calibrated (a speculator given: H2O, SpecPrefill and
SpecPrefill over an H2O speculator, each its own calibration) `fastest` picks among those whose
crossover the prompt reaches: the least sparse / full time at the longest length each measured
within the prompt's. Each such option is first measured on to `common_length`, the longest any of
them reached (`extended`): a slower probe stops sooner on its budget, and a ratio at 2K set against
another's at 8K chose plain SpecPrefill (0.57 at 8K) over the composition (0.81 at 2K) for 32K
prompts, where the composition is 3x faster (2026-12-02, results/cpu_bf16_long/notes.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .io.demo_model import cache_dir

# 3: the probe prices a model from two views (core/probe.TimedViews); 4: H2O's stages on torch's CPU flash
# kernel in bf16 / fp16 (backends/torch_cuda/kernels/cpu_flash.py): older prices are the twins'; 5: a length's
# ratio is the median of three paired runs' (core/probe._paired_times), no longer the faster of two runs of each
CALIBRATION_VERSION = 5
# prompt lengths the calibration may measure, shortest first (cut at the model's context)
CANDIDATE_LENGTHS = (2048, 4096, 8192, 16384)
# wall seconds after which no longer length is started (the first length always runs)
CALIBRATION_BUDGET_S = 8.0
# the sparse method counts as faster only below this fraction of full prefill's time: on a shared
# machine the probe's repeats spread by ~10% (torch CPU, load 5 on 2 cores), and a tie must not
# switch methods
FASTER_BELOW = 0.97
# CPU flags that change GEMM / attention speed (x86 names as in /proc/cpuinfo)
GEMM_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")

Measure = Callable[[int], tuple[float, float]]  # prompt length -> (full seconds, sparse seconds)


def calibration_dir() -> Path:
    """$SPECFILL_CALIBRATION_DIR, else <specfill cache>/calibration ($SPECFILL_CACHE, else
    $XDG_CACHE_HOME/specfill, else ~/.cache/specfill)."""
    override = os.environ.get("SPECFILL_CALIBRATION_DIR")
    return Path(override) if override else cache_dir() / "calibration"


def cpu_description() -> dict[str, Any]:
    """CPU model, the GEMM-relevant flags it has and its logical CPUs (Linux: /proc/cpuinfo)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and not model:
                    model = value.strip()
                elif name.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "gemm_flags": [f for f in GEMM_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
    }


def calibration_key(
    *,
    backend: str,
    device: str,
    dtype: str,
    threads: int,
    model_shape: dict[str, Any],
    method: str,
    method_config: dict[str, Any],
) -> dict[str, Any]:
    """Everything a crossover depends on: this machine's CPU, the backend, device, dtype, thread
    count, model shape and the sparse method with its configuration."""
    return {
        "version": CALIBRATION_VERSION,
        "machine": cpu_description(),
        "backend": backend,
        "device": device,
        "dtype": dtype,
        "threads": threads,
        "model_shape": model_shape,
        "method": method,
        "method_config": method_config,
    }


def calibration_path(key: dict[str, Any]) -> Path:
    """calibration_dir()/<backend>-<method>-<hash of the key>.json."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return calibration_dir() / f"{key['backend']}-{key['method']}-{digest}.json"


def crossover_from_points(points: dict[int, tuple[float, float]]) -> int | None:
    """Shortest length L with sparse < FASTER_BELOW * full at L and every longer length; None if none."""
    crossover = None
    for length in sorted(points, reverse=True):
        full, sparse = points[length]
        if not sparse < FASTER_BELOW * full:
            break
        crossover = length
    return crossover


def fastest(calibrations: dict[str, dict[str, Any]], n_tokens: int) -> str | None:
    """The name of the calibration {name: calibration data} to run an n_tokens prompt with, or
    None (full prefill): among those whose crossover is at most n_tokens, the least sparse / full
    ratio at the longest length it measured up to n_tokens (a ratio: the full times of a length are
    the same prefill, and a calibration cut by its budget may lack a length another measured);
    ties go to the earlier name."""
    best, best_ratio = None, float("inf")
    for name, data in calibrations.items():
        crossover = data.get("crossover_tokens")
        if crossover is None or crossover > n_tokens:
            continue
        points = {int(n): p for n, p in data["points"].items() if int(n) <= n_tokens}
        point = points[max(points)]
        ratio = point["sparse_s"] / max(point["full_s"], 1e-12)
        if ratio < best_ratio:
            best, best_ratio = name, ratio
    return best


def common_length(calibrations: Sequence[dict[str, Any]], n_tokens: int) -> int | None:
    """The longest length any of `calibrations` measured up to n_tokens (None: none did): where
    options weighed against each other are compared, as every method's ratio to full prefill
    falls with the length and a budget cuts a slower probe shorter."""
    lengths = [int(n) for data in calibrations for n in data["points"] if int(n) <= n_tokens]
    return max(lengths, default=None)


def extended(key: dict[str, Any], data: dict[str, Any], measure: Measure, lengths: Sequence[int]) -> dict[str, Any]:
    """The calibration `data` of `key` with each of `lengths` it lacks measured (whatever the
    budget), its crossover recomputed, saved; `data` itself when it lacks none."""
    missing = sorted(n for n in lengths if str(n) not in data["points"])
    if not missing:
        return data
    points = {int(n): (p["full_s"], p["sparse_s"]) for n, p in data["points"].items()}
    points |= {n: measure(n) for n in missing}
    return save_calibration(key, points, data.get("how", "probe (core/probe.py)"))


def read_calibration(key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached calibration for `key`, or None when there is none, it is unreadable, or it was
    measured for another machine description (a file copied from elsewhere is never used)."""
    path = calibration_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("points"), dict):
        return None
    crossover = data.get("crossover_tokens")
    if crossover is not None and (isinstance(crossover, bool) or not isinstance(crossover, int) or crossover < 1):
        return None
    return data


def save_calibration(key: dict[str, Any], points: dict[int, tuple[float, float]], how: str) -> dict[str, Any]:
    """Write the calibration of `key` from points {length: (full s, sparse s)}; returns it."""
    data = {
        "key": key,
        "how": how,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "points": {
            str(n): {"full_s": round(full, 6), "sparse_s": round(sparse, 6)}
            for n, (full, sparse) in sorted(points.items())
        },
        "crossover_tokens": crossover_from_points(points),
    }
    write_calibration(key, data)
    return data


def write_calibration(key: dict[str, Any], data: dict[str, Any]) -> None:
    """Write `data` as the file of `key` whole or not at all (a partial file, then one rename)."""
    path = calibration_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)


def calibrate(
    measure: Measure,
    lengths: Sequence[int],
    budget_s: float = CALIBRATION_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
    min_points: int = 1,
) -> dict[int, tuple[float, float]]:
    """Measure ascending `lengths` until `budget_s` wall seconds are spent (the first `min_points`
    always run)."""
    if not lengths:
        raise ValueError("a calibration needs at least one prompt length")
    started, points = clock(), {}
    for length in sorted(lengths):
        if len(points) >= max(1, min_points) and clock() - started > budget_s:
            break
        points[length] = measure(length)
    return points


def calibrated_crossover(
    key: dict[str, Any], measure: Measure, lengths: Sequence[int], *, refresh: bool = False
) -> tuple[int | None, str]:
    """(crossover tokens or None, where it came from) for `key` on this machine: the cached
    calibration when its machine description matches, else (or with refresh) measured now."""
    crossover, where, _ = calibrated(key, measure, lengths, refresh=refresh)
    return crossover, where


def calibrated(
    key: dict[str, Any], measure: Measure, lengths: Sequence[int], *, refresh: bool = False, min_points: int = 1
) -> tuple[int | None, str, dict[str, Any]]:
    """calibrated_crossover's (crossover, where it came from) and the calibration data itself
    (measured: calibrate's first `min_points` lengths whatever the budget)."""
    data = None if refresh else read_calibration(key)
    if data is None:
        data = save_calibration(key, calibrate(measure, lengths, min_points=min_points), "probe (core/probe.py)")
        return data["crossover_tokens"], f"calibrated now ({calibration_path(key)})", data
    return data["crossover_tokens"], f"calibrated {data['measured_at']} ({calibration_path(key)})", data
