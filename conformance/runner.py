"""Runs every check group against a backend adapter and collects a report."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from typing import Callable

from specfill.core.tolerances import TOLERANCES

from .adapter import DEFAULT_DTYPES, ConformanceAdapter, adapter_factory
from .checks_h2o import H2O_CHECKS
from .checks_h2o_prefix import H2O_PREFIX_CHECKS
from .checks_hybrid_cache import HYBRID_CACHE_CHECKS
from .checks_kv_cache import KV_CACHE_CHECKS
from .checks_specprefill import SPECPREFILL_CHECKS
from .results import Checker, CheckResult

CheckGroup = Callable[[ConformanceAdapter, Checker], None]
CHECK_GROUPS: dict[str, CheckGroup] = {
    **H2O_CHECKS,
    **H2O_PREFIX_CHECKS,
    **SPECPREFILL_CHECKS,
    **KV_CACHE_CHECKS,
    **HYBRID_CACHE_CHECKS,
}


@dataclass
class Report:
    backend: str
    dtypes: list[str]
    kernels: str = "auto"
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    machine: str = field(
        default_factory=lambda: (
            f"{platform.node()} {platform.machine()} {platform.system()} python {platform.python_version()}"
        )
    )

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    @property
    def passed(self) -> bool:
        return bool(self.results) and not self.failures


def run_group(adapter: ConformanceAdapter, dtype: str, group: str) -> list[CheckResult]:
    """One check group at one dtype; an exception inside the backend is a failed check."""
    checker = Checker(dtype)
    try:
        CHECK_GROUPS[group](adapter, checker)
    except Exception as err:  # noqa: BLE001 - a crashing backend is a result, not a suite error
        checker.crashed(group, "-", err)
    return checker.results


def run_conformance(
    backend: str,
    dtypes: list[str] | None = None,
    make_adapter: Callable[..., ConformanceAdapter] | None = None,
    use_kernels: bool | None = None,
) -> Report:
    """Every check group for `backend` at each dtype (default: the backend's usual dtypes);
    use_kernels forces custom kernels (True) or ops twins (False), None lets the backend pick."""
    factory = make_adapter or adapter_factory(backend)
    dtypes = list(dtypes or DEFAULT_DTYPES.get(backend, ("float32",)))
    for dtype in dtypes:
        if dtype not in TOLERANCES:
            raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(TOLERANCES)})")
    report = Report(backend, dtypes, kernels={None: "auto", True: "forced", False: "ops twins"}[use_kernels])
    start = time.perf_counter()
    for dtype in dtypes:
        adapter = factory(dtype=dtype, use_kernels=use_kernels)
        for group in CHECK_GROUPS:
            report.results.extend(run_group(adapter, dtype, group))
    report.seconds = time.perf_counter() - start
    return report
