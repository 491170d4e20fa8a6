"""Tests of the adapters (mlx-lm on MLX, transformers on torch): tiny random-weight models of the
library's own classes, built from configs written here (mlx_archs.py, torch_archs.py).

A test that takes `backend` runs once per backend (the backend's module, mlx_backend.py or
torch_backend.py), and with `@pytest.mark.archs(...)` once per architecture of that backend's
named sets ("honoured", "refused"); a test that also takes `refusal` runs per method the
backend's refusal cases name. A backend whose libraries are missing gives one skipped case per
test; its own test files (test_mlx_*.py, test_transformers_*.py) are not collected. One torch
thread (the machine is shared and the models are tiny)."""

from __future__ import annotations

import importlib

import pytest

from tests.adapters.support import BACKENDS, installed

collect_ignore_glob = ([] if installed("mlx") else ["test_mlx_*.py"]) + (
    [] if installed("torch") else ["test_transformers_*.py", "test_torch_*.py"]
)


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "archs(*sets): run a `backend` test per architecture of the backend's sets (honoured, refused)"
    )


def pytest_generate_tests(metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("archs")
    names = ["backend"] + (["arch"] if marker else []) + (["refusal"] if "refusal" in metafunc.fixturenames else [])
    params = []
    for name, libraries in BACKENDS.items():
        if not installed(name):
            params.append(
                pytest.param(
                    name,
                    *[None] * (len(names) - 1),
                    id=name,
                    marks=pytest.mark.skip(reason=f"{' and '.join(libraries)} not installed"),
                )
            )
            continue
        backend = importlib.import_module(f"tests.adapters.{name}_backend")
        archs = (
            [arch for group in marker.args for arch in sorted(getattr(backend, group.upper()))] if marker else [None]
        )
        refusals = backend.REFUSAL_NAMES if "refusal" in names else [None]
        for arch in archs:
            for refusal in refusals:
                values = [backend] + ([arch] if marker else []) + ([refusal] if refusal else [])
                params.append(pytest.param(*values, id="-".join(str(v) for v in (name, arch, refusal) if v)))
    metafunc.parametrize(names, params)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    if installed("torch"):
        import torch

        torch.set_num_threads(1)
