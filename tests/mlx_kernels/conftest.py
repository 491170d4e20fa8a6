"""Fixtures for the MLX stage tests: Metal availability marks and the emulated Metal path."""
from __future__ import annotations

import shutil

import pytest

try:
    import mlx.core as mx
except ImportError:  # a torch-only install: nothing in this folder can run
    mx = None
    collect_ignore_glob = ["test_*.py"]

HAS_METAL = mx is not None and bool(mx.metal.is_available())
NO_METAL_REASON = ("needs Apple silicon with MLX's Metal back-end (this MLX has none); "
                   "on a Mac the same pytest command runs it")
needs_metal = pytest.mark.skipif(not HAS_METAL, reason=NO_METAL_REASON)
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="the Metal emulator compiles the kernel sources with g++, which is missing")


def install_emulated_metal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every Metal kernel through the C++ emulator and report Metal as available."""
    from metal_emulator import EmulatedKernel
    from specfill.backends.mlx.kernels import dispatch, inter, intra, scoring

    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    monkeypatch.setattr(intra, "_make_intra_kernel", lambda: (
        EmulatedKernel(**intra.INTRA_ATTENTION_SPEC), EmulatedKernel(**intra.INTRA_COLSUM_SPEC)))
    monkeypatch.setattr(inter, "_make_inter_kernel", lambda: (
        EmulatedKernel(**inter.INTER_ATTENTION_SPEC), EmulatedKernel(**inter.INTER_COLSUM_SPEC)))
    monkeypatch.setattr(scoring, "_make_scoring_kernel", lambda: (
        EmulatedKernel(**scoring.SCORING_STATS_SPEC), EmulatedKernel(**scoring.SCORING_PROBS_SPEC)))


@pytest.fixture(params=[pytest.param("metal", marks=needs_metal), pytest.param("emulated", marks=needs_gxx)])
def metal_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each kernel test runs on real Metal (Macs) and through the C++ emulator (where g++ exists)."""
    if request.param == "emulated":
        install_emulated_metal(monkeypatch)
    return request.param


@pytest.fixture
def emulated_metal(monkeypatch: pytest.MonkeyPatch) -> None:
    install_emulated_metal(monkeypatch)
