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


def test_description_names_the_matmul_isa_flags_from_cpuinfo():
    """bf16 speed on torch depends on AVX-512 BF16 / AMX: every figure must say which the CPU had."""
    info = describe_machine()
    flags = open("/proc/cpuinfo").read().split()  # Linux-only test machine
    expected = [f for f in ("avx2", "avx512f", "amx_bf16") if f in flags]
    assert all(f in info["cpu_features"].split() for f in expected)
    assert ("amx_bf16" in info["cpu_features"]) == ("amx_bf16" in flags)
    assert f"[{info['cpu_features']}]" in machine_line(info)


def test_a_command_described_before_its_model_loads_names_its_threads():
    """A CLI command's threads (--threads, else the physical cores) are what the torch backend sets when
    it loads on the CPU: the machine line says them even when the run describes the machine first."""
    pytest.importorskip("torch")
    from specfill.core.cpu import command_threads

    with command_threads(1):
        assert describe_machine()["torch_threads"] == 1
