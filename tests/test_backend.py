"""The backend contract (core/backend.py): one Backend object per backend, found by every name the
CLI accepts, importing nothing heavy until asked; the CPU fallback decided once, in the API."""

import subprocess
import sys

import pytest

from specfill import api
from specfill.backends import get_backend
from specfill.cli.main import main
from specfill.core import BackendUnavailableError, ConfigError
from specfill.core.backend import Backend

NOTICE = "no CUDA GPU found: the cuda backend runs on the CPU"


def test_every_name_finds_its_backend():
    assert get_backend("cuda").name == "cuda" and get_backend("torch") is get_backend("cuda")
    assert get_backend("mlx").name == "mlx"
    assert api.get_backend("torch") is get_backend("cuda")
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tpu'"):
        get_backend("tpu")


def test_naming_a_backend_imports_no_array_library():
    code = (
        "import sys; from specfill.backends import get_backend; "
        "names = [get_backend(n).name for n in ('cuda', 'mlx', 'torch')]; "
        "bad = {'torch', 'mlx', 'mlx.core'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_library_is_one_line():
    missing = Backend(name="cuda", extra="cuda", loader_module="specfill_missing_backend_module")
    assert missing.available() == (
        "backend 'cuda' needs 'specfill_missing_backend_module', which is not installed (pip install 'specfill[cuda]')"
    )
    for call in (
        lambda: missing.load("m.gguf"),
        lambda: missing.resolve_device(None),
        lambda: missing.cpu_fallback(None),
    ):
        with pytest.raises(BackendUnavailableError, match="not installed"):
            call()


def test_the_torch_backend_resolves_and_falls_back(monkeypatch):
    torch = pytest.importorskip("torch")
    from specfill.backends.torch_cuda import placement

    class NoGpu(placement.CudaRuntime):
        def available(self) -> bool:
            return False

    cuda = get_backend("cuda")
    assert cuda.available() is None
    monkeypatch.setattr(placement, "RUNTIME", NoGpu())
    assert cuda.resolve_device(None) == torch.device("cpu") and cuda.resolve_device("cpu") == torch.device("cpu")
    import specfill.backends.torch_cuda.loader as loader

    for fast, default in ((False, torch.float32), (True, torch.bfloat16)):  # the default follows the CPU
        monkeypatch.setattr(loader, "has_fast_bf16", lambda fast=fast: fast)
        assert cuda.resolve_dtype(None) == default
    assert cuda.resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ConfigError, match="unsupported dtype"):
        cuda.resolve_dtype("int8", "cpu")
    with pytest.raises(BackendUnavailableError, match="sees no CUDA GPU"):
        cuda.resolve_device("cuda")
    assert api.choose_device("cuda", None) == ("cpu", NOTICE)
    assert api.choose_device("torch", "cuda") == ("cpu", NOTICE)
    assert api.choose_device("cuda", "cpu") == ("cpu", None)


def test_a_visible_gpu_is_no_fallback(monkeypatch):
    pytest.importorskip("torch")
    from specfill.backends.torch_cuda import placement
    from tests.torch_cuda.simulated_gpu import FakeRuntime

    monkeypatch.setattr(placement, "RUNTIME", FakeRuntime())
    assert api.choose_device("cuda", None) == (None, None)
    assert api.choose_device("cuda", "cuda:0") == ("cuda:0", None)


def test_mlx_has_no_fallback_notice():
    pytest.importorskip("mlx.core")
    assert api.choose_device("mlx", None) == (None, None) and api.choose_device("mlx", "cpu") == ("cpu", None)
    mx = pytest.importorskip("mlx.core")
    mlx = get_backend("mlx")
    assert mlx.resolve_dtype("bf16", "cpu") == mx.bfloat16 and mlx.resolve_dtype(None) is None


def test_the_cli_prints_the_fallback_and_runs_on_the_cpu(monkeypatch, capsys):
    pytest.importorskip("torch")
    from specfill.backends.torch_cuda import placement

    monkeypatch.setattr(placement.RUNTIME, "available", lambda: False)
    assert (
        main(["generate", "--backend", "cuda", "--model", "random:tiny-llama", "--prompt", "hi", "--max-tokens", "1"])
        == 0
    )
    assert capsys.readouterr().err.startswith(f"specfill: {NOTICE}\n")
