"""Bad models, prompts and settings give one clear SpecfillError, never a traceback from inside
MLX; each case also runs on the torch backend, which must raise the same class."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specfill.backends import mlx as mlx_backend
from specfill.backends import torch_cuda
from specfill.core.errors import BackendUnavailableError, ConfigError, ModelLoadError, PromptTooLongError
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig

BACKENDS = {"mlx": mlx_backend, "torch": torch_cuda}


@pytest.fixture(params=sorted(BACKENDS))
def load(request):
    return BACKENDS[request.param].load


@pytest.fixture
def expect_load_error(load):
    def expect(path, *words):
        with pytest.raises(ModelLoadError) as info:
            load(path, device="cpu")
        message = str(info.value)
        assert "\n" not in message
        for word in words:
            assert word in message, message

    return expect


def test_bad_paths_and_files(tmp_path, tiny_checkpoint, expect_load_error):
    expect_load_error(tmp_path / "nope.gguf", "does not exist", "nope.gguf")
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 a zip, not a model")
    expect_load_error(tmp_path / "model.bin", "not a GGUF", "bad magic")
    data = tiny_checkpoint("qwen2", "gguf").read_bytes()
    for keep in (10, 2000, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:keep])
        expect_load_error(tmp_path / "cut.gguf", "truncated", "cut.gguf")
    (tmp_path / "empty").mkdir()
    expect_load_error(tmp_path / "empty", "no config.json")


def test_bad_directories(tmp_path, tiny_checkpoint, expect_load_error):
    path = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    shard = path / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    expect_load_error(path, "truncated", "model.safetensors")
    weights = load_file(str(tiny_checkpoint("llama", "safetensors") / "model.safetensors"))
    weights["model.layers.1.mlp.up_proj.weight"][3, 5] = np.nan
    save_file(weights, str(shard))
    expect_load_error(path, "model.layers.1.mlp.up_proj.weight", "NaN or Inf")
    shutil.copy(tiny_checkpoint("llama", "safetensors") / "model.safetensors", shard)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, rope_scaling={"rope_type": "yarn", "factor": 4.0})))
    expect_load_error(path, "rope scaling", "yarn")
    # an architecture neither specfill, mlx-lm nor transformers knows (gpt2 now loads through the adapters)
    (path / "config.json").write_text(
        json.dumps(dict(config, model_type="no_such_arch", architectures=["NoSuchArchForCausalLM"]))
    )
    expect_load_error(path, "unsupported architecture 'no_such_arch'")


def test_foreign_quantization_config_on_mlx(tmp_path, tiny_checkpoint):
    """A quantization_config MLX cannot read (GPTQ, AWQ, ...) is named; mlx-lm's own
    `quantization` entry is the one MLX reads."""
    path = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, quantization_config={"quant_method": "gptq", "bits": 4})))
    with pytest.raises(ModelLoadError, match="'gptq'.*mlx_lm.convert"):
        mlx_backend.load(path, device="cpu")


def test_bad_dtype(tiny_checkpoint, load):
    with pytest.raises(ConfigError, match="unsupported dtype 'int8'"):
        load(tiny_checkpoint("llama", "gguf"), dtype="int8", device="cpu")


def test_bad_mlx_device(tiny_checkpoint):
    with pytest.raises(ConfigError, match="unknown MLX device 'cuda'"):
        mlx_backend.load(tiny_checkpoint("llama", "gguf"), device="cuda")


def test_gpu_without_metal_is_unavailable(tiny_checkpoint):
    import mlx.core as mx

    if mx.metal.is_available():
        pytest.skip("this machine has a Metal GPU")
    with pytest.raises(BackendUnavailableError, match="no Metal GPU"):
        mlx_backend.load(tiny_checkpoint("llama", "gguf"), device="gpu")


@pytest.fixture
def model(tiny_checkpoint, load):
    return load(tiny_checkpoint("llama", "gguf"), device="cpu")[0]


def generate(model, ids, max_tokens=4, method=PrefillMethod()):
    return model.generate_step(
        ids,
        max_tokens=max_tokens,
        sampling=SamplingConfig(),
        stop_ids=frozenset(),
        method=method,
        info=GenerationInfo(),
    )


def test_bad_prompts(model):
    context = model.args.max_position_embeddings
    with pytest.raises(PromptTooLongError, match=f"context of {context} tokens"):
        generate(model, [5] * (context - 2), max_tokens=3)  # raised before the first token
    with pytest.raises(PromptTooLongError):
        model([5] * (context + 1))
    for bad, message in (
        ([], "non-empty"),
        ([5, model.args.vocab_size], "outside the vocabulary"),
        ([5, -1], "outside the vocabulary"),
        ([[1, 2], [3, 4]], "batch 1"),
        ([0.5, 2.0], "integers"),
    ):
        with pytest.raises(ConfigError, match=message):
            generate(model, bad)
    with pytest.raises(ConfigError, match="max_tokens must be >= 0"):
        generate(model, [5, 6], max_tokens=-1)


def test_specprefill_has_no_prompt_logits(model):
    with pytest.raises(ConfigError, match="no per-position logits"):
        model.prompt_logits([5, 6, 7], method=PrefillMethod("specprefill"), info=GenerationInfo())
