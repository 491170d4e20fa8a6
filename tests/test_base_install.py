"""A base install (numpy + tqdm, no optional extra) can show every command's help and gives a
one-line error, not a traceback, when a command needs a missing extra; `python -m specfill` is
the `specfill` command.

The extras are hidden in a subprocess by a meta-path finder that refuses to import them, so the
test means the same on a machine where they are installed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

EXTRAS = (
    "torch",
    "triton",
    "mlx",
    "mlx_lm",
    "gguf",
    "safetensors",
    "tokenizers",
    "jinja2",
    "matplotlib",
    "transformers",
    "accelerate",
)
BLOCKER = f"""
import importlib.abc, runpy, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Refuse())
sys.argv = ["specfill", *sys.argv[1:]]
runpy.run_module("specfill", run_name="__main__", alter_sys=True)
"""


def run_base(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [[], ["generate"], ["bench"], ["eval"], ["parity"], ["conformance"]])
def test_help_works_without_extras(command):
    result = run_base(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: specfill") and not result.stderr


@pytest.mark.parametrize("backend,extra", [("cuda", "cuda"), ("mlx", "mlx")])
def test_a_missing_extra_is_one_line(backend, extra):
    result = run_base("generate", "--backend", backend, "--model", "random:tiny-llama", "--prompt", "1 2")
    assert result.returncode == 2
    assert result.stderr.startswith("specfill: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert f"specfill[{extra}]" in result.stderr


def test_reference_conformance_runs_without_extras(tmp_path):
    result = run_base("conformance", "--backend", "reference", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "PASS" in result.stdout


def test_python_m_specfill_is_the_command():
    result = subprocess.run(
        [sys.executable, "-m", "specfill", "generate", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: specfill generate")
    bad = subprocess.run(
        [sys.executable, "-m", "specfill", "generate", "--chunk-size", "x"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stderr.startswith("specfill: error: ")
