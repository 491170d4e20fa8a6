"""`specfill generate --model <directory>` (an mlx-lm directory on MLX, a transformers one on
torch) for families the project has no model file for: a mixture of experts answers under every
method, a refused one says why in one line."""

from __future__ import annotations

import pytest

from specfill.cli.main import main

_DIRECTORIES: dict[str, object] = {}


def generate(capsys, backend, directory, *options: str) -> tuple[int, str, str]:
    capsys.readouterr()  # what writing the test model printed
    code = main(
        [
            "generate",
            "--backend",
            backend.CLI_BACKEND,
            "--device",
            "cpu",
            "--model",
            str(directory),
            "--prompt",
            "The capital of France is Paris. " * 6,
            "--max-tokens",
            "4",
            *options,
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def moe_directory(backend, tmp_path_factory):
    """One qwen3_moe directory per backend, written once for the tests of this file."""
    if backend.NAME not in _DIRECTORIES:
        _DIRECTORIES[backend.NAME] = backend.save_directory("qwen3_moe", tmp_path_factory.mktemp("cli") / "qwen3_moe")
    return _DIRECTORIES[backend.NAME]


@pytest.mark.parametrize("method", [["full"], ["h2o"], ["specprefill", "--speculator", "self:1"]])
def test_generate_runs_a_family_without_a_model_file(backend, moe_directory, capsys, method):
    code, out, err = generate(
        capsys, backend, moe_directory, "--method", *method, "--chunk-size", "8", "--h2o-local", "2", "--h2o-heavy", "2"
    )
    assert code == 0, err
    assert out.strip(), "printed generated text"
    assert "Loading weights" not in err, "the library's progress bars stay off"


def test_a_method_the_family_cannot_honour_is_one_error_line(backend, tmp_path, capsys):
    arch, config, refusal = backend.CLI_REFUSAL
    directory = backend.save_directory(arch, tmp_path / arch, config)
    code, out, err = generate(
        capsys, backend, directory, "--method", "h2o", "--chunk-size", "8", "--h2o-local", "2", "--h2o-heavy", "2"
    )
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(refusal in line for line in lines), err


@pytest.mark.archs("terms", "latent")
@pytest.mark.parametrize("method", [["h2o"], ["specprefill", "--speculator", "self:1"]])
def test_families_with_attention_terms_run_the_sparse_methods(backend, arch, tmp_path, capsys, method):
    """gpt_oss (sinks), gemma2 (logit soft-capping) and the latent-attention families, saved and
    loaded from a directory: the terms and latent projections come from the loaded weights, and H2O
    gives what the same model's H2O gives in memory."""
    from specfill.core.config import H2OConfig
    from specfill.core.runtime import GenerationInfo, PrefillMethod
    from tests.adapters.support import assert_close, prompt

    directory = backend.save_directory(arch, tmp_path / arch)
    code, out, err = generate(
        capsys, backend, directory, "--method", *method, "--chunk-size", "8", "--h2o-local", "2", "--h2o-heavy", "2"
    )
    assert code == 0 and out.strip(), err
    if method == ["h2o"]:
        model, _ = backend.load(directory, dtype="float32", device="cpu")
        ids = prompt(30, seed=6)
        h2o = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=8, batch_size=64, local=2, heavy=3, layers="all"))
        assert_close(
            model.prompt_logits(ids, method=h2o, info=GenerationInfo()),
            backend.adapted(backend.build(arch)).prompt_logits(ids, method=h2o, info=GenerationInfo()),
            f"{arch} loaded",
        )
