"""Check results and the collector that compares a backend's values with the reference."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from specfill.core.tolerances import TOLERANCES, Tolerance, max_violation


@dataclass(frozen=True)
class CheckResult:
    check: str  # stage and quantity, e.g. "h2o.intra_attention.colsum"
    case: str
    dtype: str
    passed: bool
    max_error: float | None
    tolerance: str
    detail: str = ""

    def to_dict(self) -> dict:
        out = asdict(self)
        if out["max_error"] is not None and not np.isfinite(out["max_error"]):
            out["max_error"] = str(out["max_error"])
        return out


class Checker:
    """Collects results for one adapter at one dtype."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.tol: Tolerance = TOLERANCES[dtype]
        self.results: list[CheckResult] = []

    def close(self, check: str, case: str, got: np.ndarray, want: np.ndarray) -> bool:
        """got matches want within the dtype's tolerance (and is finite exactly where want is)."""
        err, ok = max_violation(got, want, self.tol)
        detail = (
            ""
            if ok
            else f"shape {np.shape(got)} vs {np.shape(want)}"
            if np.shape(got) != np.shape(want)
            else "non-finite values or error above tolerance"
        )
        self.results.append(
            CheckResult(check, case, self.dtype, ok, err, f"atol={self.tol.atol:g} rtol={self.tol.rtol:g}", detail)
        )
        return ok

    def exact(self, check: str, case: str, ok: bool, detail: str = "") -> bool:
        """A discrete property (indices, counts, positions) that must hold exactly."""
        self.results.append(CheckResult(check, case, self.dtype, bool(ok), None, "exact", "" if ok else detail))
        return bool(ok)

    def at_least(self, check: str, case: str, value: float, minimum: float, detail: str = "") -> bool:
        ok = value >= minimum
        self.results.append(
            CheckResult(
                check, case, self.dtype, ok, 1.0 - value, f">= {minimum:g}", detail if not ok or value < 1.0 else ""
            )
        )
        return ok

    def skipped(self, check: str, case: str, reason: str) -> None:
        """A group that cannot run on this backend (no model of its kind): recorded, not failed."""
        self.results.append(CheckResult(check, case, self.dtype, True, None, "skipped", reason))

    def crashed(self, check: str, case: str, err: BaseException) -> None:
        self.results.append(
            CheckResult(check, case, self.dtype, False, None, "-", f"raised {type(err).__name__}: {err}")
        )
