"""Tolerances the conformance suite uses, per compute dtype, and why.

Inputs are rounded to the dtype under test before the float64 reference sees them, so only the
backend's arithmetic is measured, never input rounding. A value passes when
|got - want| <= atol + rtol * |want| elementwise.

A layer's attention terms (sinks, logit soft-cap: the "sinks" and "softcap" conformance cases) are
checked at the same tolerances, because neither widens the error a dtype's arithmetic makes: the
soft-cap cap * tanh(s / cap) has slope at most 1, so it never amplifies a logit's error (it adds
one tanh rounding and shrinks logits of |100| to |cap|), and a sink is one more exp() term of a
float32 denominator whose argument (sink - m, sinks up to |100| as logits are) carries the same
~1e-5 absolute error the logits' rows already budget for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    memory_jaccard: float  # least mean Jaccard of whole-prompt memory sets vs the reference
    why: str


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(
        1e-10,
        1e-10,
        1.0,
        "same math in another order: float64 rounding (1e-16) times at most ~1e3 terms, with margin;"
        " memory sets must be identical",
    ),
    "float32": Tolerance(
        1e-4,
        1e-4,
        0.99,
        "fp32 unit roundoff 6e-8; logits up to |100| carry ~1e-5 absolute error into exp(),"
        " i.e. ~1e-5 relative on weights and outputs, with 10x margin; rare near-ties of"
        " accumulated scores may flip one heavy hitter",
    ),
    "float16": Tolerance(
        4e-3,
        4e-3,
        0.9,
        "fp16 unit roundoff 4.9e-4 on P before the PV product and on the stored output"
        " (statistics stay fp32): about 4 ulps; score ties under rounding flip heavy hitters",
    ),
    "bfloat16": Tolerance(
        3e-2,
        3e-2,
        0.9,
        "bf16 unit roundoff 3.9e-3 on P and the output (statistics stay fp32): about 4 ulps;"
        " score ties under rounding flip heavy hitters",
    ),
}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to `dtype` precision, returned as float64 (bf16 by round-to-nearest-even)."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x.copy()
    if dtype in ("float32", "float16"):
        return x.astype(dtype).astype(np.float64)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"unknown dtype {dtype!r}")


def max_violation(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> tuple[float, bool]:
    """(max |got - want|, passed); shapes must match and got must be finite where want is."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf"), False
    if not np.array_equal(np.isfinite(got), np.isfinite(want)):
        return float("inf"), False
    finite = np.isfinite(want)
    if not finite.any():
        return 0.0, bool(np.array_equal(got, want))
    err = np.abs(got[finite] - want[finite])
    ok = bool(np.all(err <= tol.atol + tol.rtol * np.abs(want[finite])))
    return float(err.max()), ok
