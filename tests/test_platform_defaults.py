"""The default backend: mlx where MLX with Metal is importable, else cuda (the torch backend)."""

import sys

import pytest

from specfill import api
from specfill.cli.main import build_parser, main


@pytest.mark.parametrize("metal, expected", [(True, "mlx"), (False, "cuda")])
def test_default_backend_follows_metal(monkeypatch, metal, expected):
    monkeypatch.setattr(api, "mlx_metal_available", lambda: metal)
    assert api.default_backend() == expected
    assert api.resolve_backend(None) == expected
    assert api.resolve_backend("cuda") == "cuda" and api.resolve_backend("mlx") == "mlx"  # named wins


def test_without_mlx_installed_the_default_is_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx", None)  # `import mlx.core` raises ImportError
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    assert api.mlx_metal_available() is False and api.default_backend() == "cuda"


def test_linux_mlx_has_no_metal():
    mx = pytest.importorskip("mlx.core")
    assert api.mlx_metal_available() is bool(mx.metal.is_available())


def test_load_uses_the_default_and_backend_overrides(monkeypatch):
    seen = []

    class FakeModel(str):  # the path it was loaded from, on one process (LoadedModel.distributed)
        distributed = None

    class FakeBackend:
        @staticmethod
        def load(path, dtype=None, device=None):
            return FakeModel(path), dtype

    def fake_backend(backend):
        seen.append(api.resolve_backend(backend))
        return FakeBackend

    monkeypatch.setattr(api, "get_backend", fake_backend)
    monkeypatch.setattr(api, "check_computes_finite", lambda model, dtype: None)  # the fake loads no model
    monkeypatch.setattr(api, "mlx_metal_available", lambda: True)
    assert api.load("m.gguf") == ("m.gguf", None)
    api.load("m.gguf", backend="cuda")
    monkeypatch.setattr(api, "mlx_metal_available", lambda: False)
    api.load("m.gguf")
    assert seen == ["mlx", "cuda", "cuda"]


def test_help_states_the_rule(capsys):
    for command in ("generate", "eval", "bench", "serve"):
        with pytest.raises(SystemExit):
            build_parser([command, "--help"]).parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "mlx where MLX with Metal is importable" in text and "else cuda" in text, command


def test_serve_takes_the_commands_defaults():
    """`specfill serve`: the platform rule for --backend (no default of its own) and --method from the
    settings table (auto included); its prefill step differs on purpose (cli/serve.py says why)."""
    from specfill.cli.serve import SERVER_PREFILL_STEP_SIZE
    from specfill.core.request import find

    serve = build_parser(["serve"])
    args = serve.parse_args(["serve", "--method", "auto"])
    assert args.backend is None and args.method == "auto"
    assert serve.parse_args(["serve"]).method == find("PrefillMethod", "name").default
    assert args.prefill_step_size == SERVER_PREFILL_STEP_SIZE


def test_cli_generate_takes_the_default(monkeypatch, capsys):
    """With 'Metal' patched in, a bare `specfill generate` goes to mlx (an unknown model path
    then fails with one line naming the path, before any Metal work)."""
    monkeypatch.setattr(api, "mlx_metal_available", lambda: True)
    assert main(["generate", "--model", "/nonexistent/model.gguf", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU found" not in err and "/nonexistent/model.gguf" in err


def test_torch_is_the_cuda_backend_by_another_name(capsys):
    """`--backend torch` (and load(..., backend="torch")) is the torch backend, reported as cuda."""
    assert api.resolve_backend("torch") == "cuda" and api.get_backend("torch") is api.get_backend("cuda")
    assert (
        main(["generate", "--backend", "torch", "--model", "random:tiny-llama", "--prompt", "hi", "--max-tokens", "2"])
        == 0
    )
    assert "unknown backend" not in capsys.readouterr().err
