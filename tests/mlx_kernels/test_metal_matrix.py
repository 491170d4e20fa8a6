"""A fast subset of the Metal matrix (backends/mlx/kernels/matrix.py) through the C++ emulation:
every stage x dtype at one head dim and an odd GQA group; the full matrix is scripts/metal_matrix.py."""

from __future__ import annotations

import pytest
from mlx_test_support import needs_gxx

from specfill.backends.mlx.kernels import matrix


@needs_gxx
@pytest.mark.parametrize("stage", matrix.STAGES)
def test_matrix_cells_pass_on_the_emulated_kernels(emulated_metal, stage):
    cells = [matrix.MetalCell(stage, dtype, 64, 7) for dtype in matrix.DTYPES]
    result = matrix.run_metal_matrix(cells)
    assert result["failures"] == 0, [row["failures"] for row in result["cells"]]
    assert all(row["errors"] for row in result["cells"])


@needs_gxx
def test_a_wrong_kernel_fails_its_cell(emulated_metal, monkeypatch):
    """The comparison is live: a kernel output nudged by 1e-3 is over the fp32 limit."""
    real = matrix._outputs

    def nudged(cell, use_kernel):
        out = real(cell, use_kernel)
        return {**out, "o": out["o"] + 1e-3} if use_kernel else out

    monkeypatch.setattr(matrix, "_outputs", nudged)
    row = matrix.check_metal_cell(matrix.MetalCell("inter", "float32", 64, 1))
    assert row["failures"] and row["failures"][0].startswith("o: error")


def test_a_kernel_that_cannot_launch_is_the_cells_failure(monkeypatch):
    """Without Metal (and without the emulation) forcing the kernel raises: the cell records it."""
    from specfill.backends.mlx.kernels import dispatch

    monkeypatch.setattr(dispatch, "metal_available", lambda: False)
    row = matrix.check_metal_cell(matrix.MetalCell("scoring", "float16", 64, 1))
    assert row["failures"][0].startswith("compile or launch:")


def test_doctor_without_metal_skips_the_matrix_and_says_where_it_runs():
    """This machine (no Metal): `specfill doctor --backend mlx` names the emulation instead."""
    from specfill.evaluation.doctor import environment, metal_matrix

    env = environment()
    assert not env["mlx"]["metal_available"]
    result = metal_matrix("mlx", env)
    assert "no Metal device" in result["skipped"] and "scripts/metal_matrix.py" in result["skipped"]
    assert metal_matrix("cuda", env) == {"skipped": "the Metal matrix is the mlx backend's check"}


@needs_gxx
def test_doctor_on_a_mac_runs_the_matrix(emulated_metal, monkeypatch):
    """The Mac branch, with the emulation standing in for Metal: every cell runs and is counted."""
    from specfill.evaluation import doctor

    monkeypatch.setattr(matrix, "metal_cells", lambda: [matrix.MetalCell("intra", "float16", 64, 7)])
    env = {"mlx": {"installed": True, "metal_available": True}}
    result = doctor.metal_matrix("mlx", env)
    assert (result["cells"], result["failures"], result["failed"]) == (1, 0, [])
