"""Shared by the MLX stage tests: Metal availability marks and the emulated Metal path.
(A uniquely named module: test files import it, which is not safe with a `conftest`.)"""

from __future__ import annotations

import shutil

import mlx.core as mx
import pytest

HAS_METAL = bool(mx.metal.is_available())
NO_METAL_REASON = (
    "needs Apple silicon with MLX's Metal back-end (this MLX has none); on a Mac the same pytest command runs it"
)
needs_metal = pytest.mark.skipif(not HAS_METAL, reason=NO_METAL_REASON)
needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None, reason="the Metal emulator compiles the kernel sources with g++, which is missing"
)


def install_emulated_metal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every Metal kernel through the C++ emulator and report Metal as available."""
    from metal_emulator import EmulatedKernel

    from specfill.backends.mlx.kernels import dispatch, inter, intra, scoring

    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    monkeypatch.setattr(
        intra,
        "_make_intra_kernel",
        lambda: (EmulatedKernel(**intra.INTRA_ATTENTION_SPEC), EmulatedKernel(**intra.INTRA_COLSUM_SPEC)),
    )
    monkeypatch.setattr(
        inter,
        "_make_inter_kernel",
        lambda: (EmulatedKernel(**inter.INTER_ATTENTION_SPEC), EmulatedKernel(**inter.INTER_COLSUM_SPEC)),
    )
    monkeypatch.setattr(
        scoring,
        "_make_scoring_kernel",
        lambda: (EmulatedKernel(**scoring.SCORING_STATS_SPEC), EmulatedKernel(**scoring.SCORING_PROBS_SPEC)),
    )
