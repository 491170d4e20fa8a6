"""RoPE frequencies from ModelArgs, shared by both backends, and Llama 3 scaling recovered from a
GGUF's `rope_freqs.weight` (llama.cpp stores the per-frequency divisors, not the parameters)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import ModelLoadError
from .models import ModelArgs


def base_inv_freq(head_dim: int, rope_theta: float) -> np.ndarray:
    """theta^(-2i/d) for i < d/2, float64."""
    return rope_theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def llama3_freq_factors(head_dim: int, rope_theta: float, scaling: dict[str, Any]) -> np.ndarray:
    """Divisors of the base inverse frequencies under Llama 3 scaling (as HF and llama.cpp)."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / base_inv_freq(head_dim, rope_theta)
    smooth = np.clip((context / wavelen - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1.0 - smooth) / factor + smooth)


def rope_inv_freq(args: ModelArgs, local: bool = False) -> np.ndarray:
    """Inverse frequencies [head_dim / 2] (float32) for half-split RoPE, with the checkpoint's
    scaling applied (default, linear, llama3); other scaling types raise ModelLoadError.
    local: the table of sliding layers where the family gives them their own base (Gemma 3's
    rope_local_theta, never scaled, as HF builds it); otherwise the global table."""
    if local and args.rope_local_theta is not None:
        return base_inv_freq(args.head_dim, args.rope_local_theta).astype(np.float32)
    inv_freq = base_inv_freq(args.head_dim, args.rope_theta)
    scaling = args.rope_scaling
    kind = None if scaling is None else scaling.get("rope_type")
    if kind in (None, "default"):
        return inv_freq.astype(np.float32)
    if kind == "linear":
        return (inv_freq / float(scaling["factor"])).astype(np.float32)
    if kind == "llama3":
        return (inv_freq / llama3_freq_factors(args.head_dim, args.rope_theta, scaling)).astype(np.float32)
    raise ModelLoadError(f"rope scaling type {kind!r} is not supported (supported: linear, llama3)")


def llama3_scaling_from_factors(factors: np.ndarray, head_dim: int, rope_theta: float) -> dict[str, Any] | None:
    """Fit HF's llama3 rope_scaling to llama.cpp's divisors (None when they are all 1).

    In the smooth band 1/f = (1 - s)/factor + s with s = C/wavelen*k - lo*k, k = 1/(hi - lo):
    linear in 1/wavelen, so two band points give C*k and lo*k; lo is taken as 1 (every Llama 3
    release). The fit is checked against every divisor.
    """
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.shape[0] != head_dim // 2:
        raise ModelLoadError(f"rope_freqs.weight has {f.shape[0]} entries, expected {head_dim // 2}")
    factor = float(f.max())
    if factor <= 1.0 + 1e-6:
        return None
    band = (f > 1.0 + 1e-4) & (f < factor * (1.0 - 1e-4))
    if band.sum() < 2:
        raise ModelLoadError(
            "rope_freqs.weight has fewer than two smoothed frequencies: cannot recover its Llama 3 rope scaling"
        )
    smooth = (1.0 / f[band] - 1.0 / factor) / (1.0 - 1.0 / factor)
    inv_wavelen = base_inv_freq(head_dim, rope_theta)[band] / (2 * math.pi)
    slope, intercept = np.polyfit(inv_wavelen, smooth, 1)
    k = -intercept  # lo * k with lo = 1
    if not k > 0 or not slope > 0:
        raise ModelLoadError("rope_freqs.weight does not follow Llama 3 rope scaling")
    scaling = {
        "rope_type": "llama3",
        "factor": float(round(factor, 4)),
        "low_freq_factor": 1.0,
        "high_freq_factor": float(round(1.0 + 1.0 / k, 4)),
        "original_max_position_embeddings": int(round(slope / k)),
    }
    if not np.allclose(llama3_freq_factors(head_dim, rope_theta, scaling), f, rtol=1e-3):
        raise ModelLoadError("rope_freqs.weight does not follow Llama 3 rope scaling")
    return scaling
