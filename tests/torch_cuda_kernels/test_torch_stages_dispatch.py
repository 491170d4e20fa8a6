"""Kernel-or-twin dispatch, the conformance adapter's errors, and the twins at float64."""

import os
import subprocess
import sys

import pytest
import torch

from specfill.backends.torch_cuda.conformance import make_adapter
from specfill.backends.torch_cuda.kernels import choose_kernel, intra_attention, kernel_unavailable_reason
from specfill.backends.torch_cuda.kernels.dispatch import interpreting, triton_installed
from specfill.conformance import CHECK_GROUPS, run_group
from specfill.core import BackendUnavailableError

torch.set_num_threads(1)
CPU_ONLY = not torch.cuda.is_available() and not interpreting()


def test_cpu_tensors_use_the_twin_and_never_import_triton():
    code = (
        "import sys, torch\n"
        "from specfill.backends.torch_cuda.kernels import intra_attention, attention_scores\n"
        "q = torch.randn(2, 9, 16)\n"
        "intra_attention(q, q, q, 4, 0.25)\n"
        "attention_scores(torch.randn(1, 3, 2, 16), q[None], 0.25)\n"
        "assert 'triton' not in sys.modules, 'the twin path imported triton'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


def test_forced_twin_and_auto_on_cpu():
    x = torch.zeros(1, 2, 16)
    assert choose_kernel(False, x) is False
    assert choose_kernel(None, x) is False  # CPU tensors: the twin, even under the interpreter


@pytest.mark.skipif(not CPU_ONLY, reason="needs a CPU-only process without TRITON_INTERPRET")
def test_forcing_kernels_on_cpu_is_one_clear_error():
    q = torch.randn(2, 8, 16)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1" if triton_installed() else "Triton"):
        intra_attention(q, q, q, 4, 0.25, use_kernel=True)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1" if triton_installed() else "Triton"):
        make_adapter("float32", use_kernels=True)


@pytest.mark.skipif(not triton_installed(), reason="Triton is not installed")
def test_kernels_refuse_float64_clearly():
    assert "float64" in kernel_unavailable_reason(torch.device("cuda"), torch.float64)
    assert kernel_unavailable_reason(torch.device("cuda"), torch.float16) is None


def test_adapter_rejects_unknown_dtype():
    with pytest.raises(BackendUnavailableError, match="int8"):
        make_adapter("int8")
    adapter = make_adapter("float16", use_kernels=False)
    assert (adapter.name, adapter.dtype) == ("cuda", "float16")


@pytest.mark.parametrize("group", list(CHECK_GROUPS))
def test_twins_conform_at_float64(group):
    """float64 tolerances are 1e-10 and memory sets must be identical: the twins compute the
    reference's math, not an approximation of it."""
    results = run_group(make_adapter("float64", use_kernels=False, device="cpu"), "float64", group)
    failures = [r for r in results if not r.passed]
    assert results and not failures, "\n".join(f"{r.check} [{r.case}]: {r.detail}" for r in failures[:10])
