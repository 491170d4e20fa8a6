"""`specfill generate --backend cuda --model <transformers directory>` for families the project has
no model file for: a mixture of experts answers under every method, a refused one says why in
one line; `load(<directory>)` reads it in the dtype asked for."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.adapted import AdaptedModel
from specfill.cli.main import main
from specfill.core.runtime import GenerationInfo, PrefillMethod

from specfill.core.config import H2OConfig

from tests.torch_adapter.archs import AT_LOAD, REFUSED, TERMS, build, save_directory
from tests.torch_adapter.support import adapted, assert_close, prompt


def generate(capsys, directory, *options: str) -> tuple[int, str, str]:
    capsys.readouterr()  # what writing the test model printed
    code = main(["generate", "--backend", "cuda", "--device", "cpu", "--model", str(directory),
                 "--prompt", "The capital of France is Paris. " * 6, "--max-tokens", "4", *options])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def moe_directory(tmp_path_factory):
    return save_directory("qwen3_moe", tmp_path_factory.mktemp("cli") / "qwen3_moe")


@pytest.mark.parametrize("method", [["full"], ["h2o"], ["specprefill", "--speculator", "self:1"]])
def test_generate_runs_a_family_without_a_model_file(moe_directory, capsys, method):
    code, out, err = generate(capsys, moe_directory, "--method", *method, "--chunk-size", "8", "--h2o-local", "2",
                              "--h2o-heavy", "2")
    assert code == 0, err
    assert out.strip(), "printed generated text"
    assert "Loading weights" not in err, "transformers' progress bars stay off"


def test_a_method_the_family_cannot_honour_is_one_error_line(tmp_path, capsys):
    directory = save_directory("deepseek_v3", tmp_path / "deepseek_v3", REFUSED["deepseek_v3"][0])
    code, out, err = generate(capsys, directory, "--method", "h2o", "--chunk-size", "8", "--h2o-local", "2",
                              "--h2o-heavy", "2")
    assert code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any("H2O cannot run on deepseek_v3: layer 0 (multi-head latent attention" in line for line in lines), err


@pytest.mark.parametrize("arch", TERMS)
def test_families_with_attention_terms_run_the_sparse_methods_from_a_directory(arch, tmp_path, capsys):
    """gpt_oss (sinks) and gemma2 (logit soft-capping) saved and loaded: the terms are read from the
    loaded weights, and H2O gives what the same model's H2O gives in memory."""
    directory = save_directory(arch, tmp_path / arch)
    code, out, err = generate(capsys, directory, "--method", "h2o", "--chunk-size", "8", "--h2o-local", "2",
                              "--h2o-heavy", "2")
    assert code == 0 and out.strip(), err
    model, _ = load(directory, dtype="float32", device="cpu")
    ids = prompt(30, seed=6)
    method = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=8, batch_size=64, local=2, heavy=3, layers="all"))
    assert_close(model.prompt_logits(ids, method=method, info=GenerationInfo()),
                 adapted(build(arch)).prompt_logits(ids, method=method, info=GenerationInfo()), f"{arch} loaded")


def test_a_family_refused_at_load_is_one_error_line(tmp_path, capsys):
    directory = save_directory("qwen3_next", tmp_path / "qwen3_next", AT_LOAD["qwen3_next"][0])
    code, out, err = generate(capsys, directory)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and "Traceback" not in err and not out.strip()
    assert len(lines) == 1 and "qwen3_next layer 0 is a linear-attention / state-space layer" in lines[0], err


def test_load_reads_the_directory_through_transformers(moe_directory):
    model, tokenizer = load(moe_directory, dtype="float32", device="cpu")
    assert isinstance(model.model, AdaptedModel) and model.dtype == torch.float32 and tokenizer.vocab_size == 320
    ids = prompt(30, seed=6)
    with torch.no_grad():
        want = build("qwen3_moe")(torch.tensor([ids])).logits[0].numpy()
    assert_close(model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo()), want, "saved and loaded")
    assert np.isfinite(want).all()
