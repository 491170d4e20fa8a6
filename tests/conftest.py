"""Shared pytest fixtures. Builders live in tests/fixtures (import them from `tests.fixtures`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from specfill.core.cpu import physical_cores
from tests.fixtures import write_tiny_checkpoint

# Under pytest-xdist (`make test`: one worker per core) the workers share the cores: each computes
# on its share (OMP_NUM_THREADS, which torch reads when it starts and the subprocesses a test starts
# inherit; a test or command that asks for a thread count still gets it).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, physical_cores() // _WORKERS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files holding a `slow` test first, each in its own order (a stable sort). `make test`
    hands whole files to the workers in this order (--dist loadfile --no-loadscope-reorder): a long
    file started last (xdist's default puts the files with fewest tests last, and the long ones
    often hold one) would leave the other workers idle while it runs."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """tiny_checkpoint(arch, fmt, **options) -> Path, written once per session per argument set."""
    cache: dict[tuple, Path] = {}

    def build(arch: str, fmt: str, **options) -> Path:
        key = (arch, fmt, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), arch, fmt, **options)
        return cache[key]

    return build


@pytest.fixture(scope="session", autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`method="auto"` calibrations of the tests go to a session folder, never ~/.cache."""
    folder = tmp_path_factory.mktemp("calibration")
    os.environ["SPECFILL_CALIBRATION_DIR"] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def fresh_drafting_costs(calibration_cache: Path):
    """Each test starts with no remembered drafting costs (core/methods/draft_costs.py): a drafted
    decode keeps its step costs, and a later test's draft model would otherwise skip drafting on them;
    nor with an attention probe's kept choice (backends/torch_cuda/probe_store.py), which would spare a
    later test's probe on a simulated GPU."""
    yield
    for book in calibration_cache.glob("*-drafting-*.json"):
        book.unlink()
    for book in calibration_cache.glob("cuda-attention-probe-*.json"):  # nor an attention probe's choice
        book.unlink()
