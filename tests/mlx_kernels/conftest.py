"""Fixtures for the MLX stage tests; skips the whole folder where mlx is not installed."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("mlx") is None:  # a torch-only install: nothing here can run
    collect_ignore_glob = ["test_*.py"]
else:
    from mlx_test_support import install_emulated_metal, needs_gxx, needs_metal

    @pytest.fixture(params=[pytest.param("metal", marks=needs_metal), pytest.param("emulated", marks=needs_gxx)])
    def metal_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
        """Each kernel test runs on real Metal (Macs) and through the C++ emulator (where g++ is)."""
        if request.param == "emulated":
            install_emulated_metal(monkeypatch)
        return request.param

    @pytest.fixture
    def emulated_metal(monkeypatch: pytest.MonkeyPatch) -> None:
        install_emulated_metal(monkeypatch)
