"""Runs kernel_model_cases.py in a subprocess: on CUDA when there is a GPU, else in Triton's
interpreter on CPU tensors (Triton reads TRITON_INTERPRET when it decorates a kernel, and this
process may already have imported the kernels)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specfill.backends.torch_cuda.kernels.dispatch import triton_installed

CASES = Path(__file__).with_name("kernel_model_cases.py")


@pytest.mark.skipif(not triton_installed(), reason="Triton is not installed (Linux only)")
def test_methods_with_triton_kernels_match_the_twins():
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    passed = 9 if torch.cuda.is_available() else 7  # the decode and look-ahead cases run bfloat16 on a GPU too
    assert f"{passed} passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
