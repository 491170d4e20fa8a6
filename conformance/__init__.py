"""The conformance suite: every backend's stages checked against the NumPy reference.

A backend registers `make_adapter(dtype=...)` in `adapter.REGISTRY`; `run_conformance(name)`
runs every check group, `write_reports` writes JSON + Markdown. Under pytest it runs through
tests/test_conformance.py; from the shell, `specfill conformance --backend NAME`.
"""

from specfill.core.tolerances import TOLERANCES, Tolerance

from .adapter import DEFAULT_DTYPES, REGISTRY, ConformanceAdapter, ReferenceAdapter, adapter_factory
from .report import render_markdown, write_reports
from .runner import CHECK_GROUPS, Report, run_conformance, run_group

__all__ = [
    "CHECK_GROUPS",
    "DEFAULT_DTYPES",
    "REGISTRY",
    "TOLERANCES",
    "ConformanceAdapter",
    "Report",
    "ReferenceAdapter",
    "Tolerance",
    "adapter_factory",
    "render_markdown",
    "run_conformance",
    "run_group",
    "write_reports",
]
