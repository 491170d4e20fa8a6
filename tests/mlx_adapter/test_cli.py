"""`specfill generate --model <mlx-lm directory>` for families the project has no model file for:
a mixture of experts answers under every method, a refused one says why in one line."""
from __future__ import annotations

import pytest

from specfill.cli.main import main

from tests.mlx_adapter.archs import REFUSED, TERMS, save_directory


def generate(capsys, directory, *options: str) -> tuple[int, str, str]:
    code = main(["generate", "--backend", "mlx", "--device", "cpu", "--model", str(directory),
                 "--prompt", "The capital of France is Paris. " * 6, "--max-tokens", "4", *options])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("method", [["full"], ["h2o"], ["specprefill", "--speculator", "self:1"]])
def test_generate_runs_a_family_without_a_model_file(tmp_path_factory, capsys, method):
    directory = save_directory("qwen3_moe", tmp_path_factory.mktemp("cli") / "qwen3_moe")
    code, out, err = generate(capsys, directory, "--method", *method, "--chunk-size", "8", "--h2o-local", "2",
                              "--h2o-heavy", "2")
    assert code == 0, err
    assert out.strip(), "printed generated text"


def test_a_method_the_family_cannot_honour_is_one_error_line(tmp_path, capsys):
    directory = save_directory("deepseek_v3", tmp_path / "deepseek_v3", REFUSED["deepseek_v3"][0])
    code, out, err = generate(capsys, directory, "--method", "h2o", "--chunk-size", "8", "--h2o-local", "2",
                              "--h2o-heavy", "2")
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any("H2O cannot run on deepseek_v3: layer 0 (multi-head latent attention)" in line for line in lines), err


@pytest.mark.parametrize("arch", TERMS)
@pytest.mark.parametrize("method", [["h2o"], ["specprefill", "--speculator", "self:1"]])
def test_families_with_attention_terms_run_the_sparse_methods(tmp_path, capsys, arch, method):
    """gpt_oss (sinks) and gemma2 (logit soft-capping), saved and loaded from a directory."""
    directory = save_directory(arch, tmp_path / arch)
    code, out, err = generate(capsys, directory, "--method", *method, "--chunk-size", "8", "--h2o-local", "2",
                              "--h2o-heavy", "2")
    assert code == 0 and out.strip(), err
