"""The machine description written into every result file."""
import os

import pytest

from specfill.evaluation.machine import describe_machine, machine_line


def test_description_names_cores_threads_and_load():
    torch = pytest.importorskip("torch")
    info = describe_machine({"gpu": "none here"})
    assert info["cores"] == os.cpu_count() and info["torch_threads"] == torch.get_num_threads()
    assert info["load_average_1min"] >= 0.0 and info["gpu"] == "none here"
    line = machine_line(info)
    assert f"torch {torch.get_num_threads()} thread(s)" in line and "load average" in line
    assert "GPU none here" in line
