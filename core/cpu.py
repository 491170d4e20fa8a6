"""What this machine's CPU is and what it computes fast: the model name and the matmul-relevant ISA
flags /proc/cpuinfo lists. torch's bf16 matmuls run 3-4x its fp32 on a CPU with AVX-512 BF16 or AMX,
~50x slower without (measured: docs/backends.md), so the torch backend's default dtype on a CPU
follows `has_fast_bf16` (backends/torch_cuda/loader.resolve_dtype)."""

from __future__ import annotations

import platform
from functools import lru_cache

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
