"""Runs kernel_cases.py (Triton kernels vs torch twins, conformance with kernels forced) and
fused_cases.py (the decoder's fused element-wise kernels) in a subprocess: on CUDA when there is a
GPU, else in Triton's interpreter on CPU tensors.

A subprocess because Triton reads TRITON_INTERPRET when it decorates a kernel: this process may
already have imported the kernels (or must keep running them on a GPU).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specfill.backends.torch_cuda.kernels.dispatch import triton_installed

CASES = [str(Path(__file__).with_name(name)) for name in ("kernel_cases.py", "fused_cases.py")]
# two halves run at once (the interpreter is single-threaded: the second CPU core does the other
# half); every case runs in exactly one, the first taking the slowest conformance groups
FIRST_HALF = "conformance_with_kernels_forced and (layer or reuse)"
HALVES = [FIRST_HALF, f"not ({FIRST_HALF})"]


@pytest.mark.skipif(not triton_installed(), reason="Triton is not installed (Linux only)")
@pytest.mark.slow
def test_triton_kernels_match_twins_and_conform():
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CASES, "-k", half],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for half in HALVES
    ]
    try:
        for run in runs:
            stdout, stderr = run.communicate(timeout=900)
            assert run.returncode == 0, stdout[-6000:] + stderr[-2000:]
            assert " passed" in stdout and "skipped" not in stdout, stdout[-2000:]
    finally:
        for run in runs:
            run.kill()
            run.communicate()
