"""What this machine's CPU is and what it computes fast: the model name and the matmul-relevant ISA
flags /proc/cpuinfo lists. torch's bf16 matmuls run 3-4x its fp32 on a CPU with AVX-512 BF16 or AMX,
~50x slower without (measured: docs/backends.md), so the torch backend's default dtype on a CPU
follows `has_fast_bf16` (backends/torch_cuda/loader.resolve_dtype).

A command's CPU threads are decided here too (`command_threads`, which cli/main.py enters for every
command): --threads, else this process's physical cores (the CPUs it may run on, one per core: a
core's second hyper-thread shares its matmul units and mostly adds contention). The torch backend
applies it when it loads a model on the CPU; outside a command (the library) torch's own setting,
whoever set it, stands."""

from __future__ import annotations

import os
import platform
import sys
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

from .errors import ConfigError

FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "neon", "asimd")
FAST_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def cpu_features() -> str:
    """The FEATURES flags /proc/cpuinfo lists, or '?' where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith(("flags", "Features"))), [])
    except OSError:
        return "?"
    return " ".join(f for f in FEATURES if f in flags) or "none of " + "/".join(FEATURES)


def has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX on this CPU."""
    return any(f in cpu_features().split() for f in FAST_BF16)


MAX_THREADS = 4096  # torch overflows past 2**31; no machine has more cores than this
_threads_rule: int | None = None  # the running command's thread count; None: no command chose one


@contextmanager
def command_threads(threads: int | None) -> Iterator[int]:
    """For one CLI command: compute on `threads` (--threads; ConfigError outside 1..MAX_THREADS),
    else on this process's physical cores; the rule before it is back afterwards. Yields the count."""
    global _threads_rule
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be >= 1 and <= {MAX_THREADS}, got {threads}")
    before, _threads_rule = _threads_rule, threads if threads is not None else physical_cores()
    try:
        yield _threads_rule
    finally:
        _threads_rule = before


@lru_cache(maxsize=1)
def physical_cores() -> int:
    """Distinct physical cores among the CPUs this process may run on (sched_getaffinity, which a
    container's cpuset narrows); the CPU count where /proc/cpuinfo does not say which core is which."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            blocks = f.read().split("\n\n")
    except OSError:
        return max(1, len(allowed))
    for block in blocks:
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "processor" in fields and "core id" in fields and int(fields["processor"]) in allowed:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return max(1, len(cores) or len(allowed))


def compute_threads() -> int | None:
    """CPU threads the torch backend sets when it loads a model on the CPU: the running command's
    (command_threads); None outside a command (a library user's torch setting stands)."""
    return _threads_rule


def process_peak_memory_gb() -> float:
    """This process's peak resident set, every allocator's (the CPU backends' peak memory): VmHWM of
    /proc/self/status on Linux (reset_process_peak_memory restarts it), else ru_maxrss."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 / 1e9 for line in f if line.startswith("VmHWM:"))  # kB
    except (OSError, ValueError, StopIteration):
        import resource  # POSIX only: imported where it is used, so core imports everywhere

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9  # bytes vs KiB


def reset_process_peak_memory() -> bool:
    """VmHWM back to the current resident set ("5" to /proc/self/clear_refs); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True
