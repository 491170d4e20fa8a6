"""Lean GGUF loading (backends/torch_cuda/lean_load.py) gives exactly the shared loader's model."""

import os

import pytest
import torch

from specfill.backends.torch_cuda import lean_load, load
from specfill.backends.torch_cuda.lean_load import is_gguf_file, load_gguf_state
from specfill.backends.torch_cuda.weights import build_transformer
from specfill.core import ModelLoadError
from specfill.core.io.weights import load_weights
from tests.fixtures import ARCHITECTURES

torch.set_num_threads(1)


def _shared_path_state(path, dtype):
    args, weights = load_weights(path)
    return args, build_transformer(args, weights, dtype, "cpu").state_dict()


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_state_equals_the_shared_loader(tiny_checkpoint, monkeypatch, arch, dtype):
    monkeypatch.setattr(lean_load, "BLOCK_ELEMENTS", 100)  # several blocks per matrix, partial last
    path = tiny_checkpoint(arch, "gguf")
    args, state = load_gguf_state(path, dtype, torch.device("cpu"))
    want_args, want = _shared_path_state(path, dtype)
    assert args == want_args
    got = {k: v for k, v in state.items()}
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("quant", ["Q4_0", "Q5_1", "BF16", "F16"])
def test_lean_types_and_tied_embeddings(tiny_checkpoint, quant):
    path = tiny_checkpoint("llama", "gguf", quant=quant, tie_word_embeddings=True)
    _, state = load_gguf_state(path, torch.float16, torch.device("cpu"))
    _, want = _shared_path_state(path, torch.float16)
    assert state["lm_head.weight"] is state["embed_tokens.weight"]
    for name, tensor in want.items():
        assert torch.equal(state[name], tensor), name


def test_load_takes_the_lean_path_for_gguf_only(tiny_checkpoint, monkeypatch):
    calls = []
    real = lean_load.load_gguf_state
    monkeypatch.setattr(
        "specfill.backends.torch_cuda.loader.load_gguf_state", lambda *a: calls.append(a[0]) or real(*a)
    )
    gguf_path = tiny_checkpoint("qwen2", "gguf")
    model, _ = load(gguf_path, dtype="bfloat16", device="cpu")
    assert calls == [gguf_path] and model.dtype == torch.bfloat16
    assert model.model.lm_head.weight.data_ptr() != 0
    directory = tiny_checkpoint("qwen2", "safetensors")
    assert not is_gguf_file(directory) and not is_gguf_file("random:llama-1b")
    fifo = directory.parent / "model.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    assert not is_gguf_file(fifo)  # returns at once: a FIFO is never opened (it would block)
    load(directory, device="cpu")
    assert calls == [gguf_path]


def test_lean_load_refuses_nan_and_truncation(tiny_checkpoint, tmp_path):
    source = tiny_checkpoint("llama", "gguf", quant="F32").read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(source[: len(source) - 64])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_gguf_state(truncated, torch.float32, torch.device("cpu"))
    nan_file = tmp_path / "nan.gguf"
    nan_file.write_bytes(source[:-4] + bytes.fromhex("0000c07f"))  # last float32 -> NaN
    with pytest.raises(ModelLoadError, match="NaN or Inf"):
        load_gguf_state(nan_file, torch.float32, torch.device("cpu"))
