"""Bad models, prompts and settings give one clear SpecfillError (the classes the torch backend
uses), never a traceback from inside MLX."""
from __future__ import annotations

import json
import shutil

import pytest

from specfill.backends.mlx import load
from specfill.core.config import H2OConfig
from specfill.core.errors import (BackendUnavailableError, ConfigError, ModelLoadError,
                                  PromptTooLongError)
from specfill.core.runtime import PrefillInfo, PrefillMethod, SamplingConfig


def expect_load_error(path, *words, **options):
    with pytest.raises(ModelLoadError) as info:
        load(path, **options)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_bad_paths_and_files(tmp_path, tiny_checkpoint):
    expect_load_error(tmp_path / "nope.gguf", "does not exist", "nope.gguf")
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 a zip, not a model")
    expect_load_error(tmp_path / "model.bin", "not a GGUF", "bad magic")
    data = tiny_checkpoint("qwen2", "gguf").read_bytes()
    for keep in (10, 2000, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:keep])
        expect_load_error(tmp_path / "cut.gguf", "truncated", "cut.gguf")
    (tmp_path / "empty").mkdir()
    expect_load_error(tmp_path / "empty", "no config.json")


def test_bad_directories(tmp_path, tiny_checkpoint):
    path = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    shard = path / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    expect_load_error(path, "truncated or corrupt", "model.safetensors")
    shutil.copy(tiny_checkpoint("llama", "safetensors") / "model.safetensors", shard)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, rope_scaling={"rope_type": "yarn",
                                                                            "factor": 4.0})))
    expect_load_error(path, "rope scaling", "yarn")
    (path / "config.json").write_text(json.dumps(dict(config, model_type="gpt2",
                                                      architectures=["GPT2LMHeadModel"])))
    expect_load_error(path, "unsupported architecture 'gpt2'")
    (path / "config.json").write_text(json.dumps(dict(config, quantization_config={
        "quant_method": "gptq", "bits": 4})))
    expect_load_error(path, "gptq", "mlx_lm.convert")


def test_bad_dtype_and_device(tiny_checkpoint):
    path = tiny_checkpoint("llama", "gguf")
    with pytest.raises(ConfigError, match="unsupported dtype 'int8'"):
        load(path, dtype="int8")
    with pytest.raises(ConfigError, match="unknown MLX device 'cuda'"):
        load(path, device="cuda")


def test_gpu_without_metal_is_unavailable(tiny_checkpoint):
    import mlx.core as mx

    if mx.metal.is_available():
        pytest.skip("this machine has a Metal GPU")
    with pytest.raises(BackendUnavailableError, match="no Metal GPU"):
        load(tiny_checkpoint("llama", "gguf"), device="gpu")


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load(tiny_checkpoint("llama", "gguf"), device="cpu")[0]


def generate(model, ids, max_tokens=4, method=PrefillMethod()):
    return model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(),
                               stop_ids=frozenset(), method=method, info=PrefillInfo())


def test_bad_prompts(model):
    context = model.args.max_position_embeddings
    with pytest.raises(PromptTooLongError, match=f"context of {context} tokens"):
        generate(model, [5] * (context - 2), max_tokens=3)  # raised before the first token
    with pytest.raises(PromptTooLongError):
        model([5] * (context + 1))
    for bad, message in (([], "non-empty"), ([5, model.args.vocab_size], "outside the vocabulary"),
                         ([5, -1], "outside the vocabulary"), ([[1, 2], [3, 4]], "batch 1"),
                         ([0.5, 2.0], "integers")):
        with pytest.raises(ConfigError, match=message):
            generate(model, bad)
    with pytest.raises(ConfigError, match="max_tokens must be >= 0"):
        generate(model, [5, 6], max_tokens=-1)


def test_sparse_prefill_methods_are_not_there_yet(model):
    for method in (PrefillMethod("h2o", h2o=H2OConfig()), PrefillMethod("specprefill")):
        with pytest.raises(BackendUnavailableError, match="not implemented on the MLX backend"):
            generate(model, [5, 6, 7], method=method)
