"""A GGUF file of an architecture specfill has no model file for (starcoder2) loads through
transformers' GGUF support on the torch backend: the weights come back as written (F32: the
original model's logits; Q8_0: within its rounding), the tokenizer from the GGUF's metadata, and
the methods run on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.adapted import AdaptedModel
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.adapters.support import H2O, assert_close, greedy, prompt, spec
from tests.adapters.torch_archs import build, save_gguf


@pytest.fixture(scope="module")
def want() -> np.ndarray:
    with torch.no_grad():
        return build("starcoder2", {})(torch.tensor([prompt(30, seed=13)])).logits[0].numpy()


def test_an_f32_gguf_loads_through_transformers_and_runs_every_method(tmp_path, want):
    model, tokenizer = load(
        save_gguf("starcoder2", tmp_path / "tiny-starcoder2-f32.gguf"), dtype="float32", device="cpu"
    )
    assert isinstance(model.model, AdaptedModel) and model.args.architecture == "starcoder2"
    assert tokenizer.vocab_size == 320 and tokenizer.encode("The capital of France")
    ids = prompt(30, seed=13)
    assert_close(model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo()), want, "starcoder2 GGUF F32")
    for method in (H2O, spec(0.5)):
        assert len(greedy(model, ids, 3, method)) == 3


def test_a_q8_0_gguf_comes_back_within_its_rounding(tmp_path, want):
    model, _ = load(
        save_gguf("starcoder2", tmp_path / "tiny-starcoder2-q8_0.gguf", "Q8_0"), dtype="float32", device="cpu"
    )
    got = model.prompt_logits(prompt(30, seed=13), method=PrefillMethod(), info=GenerationInfo())
    err = np.abs(got - want).max()
    assert 0 < err < 0.05 * np.abs(want).max(), err  # Q8_0 rounds each weight by <= 1/254 of its block's max


def test_a_gguf_transformers_cannot_load_is_one_specfill_line(tmp_path, capfd):
    """A falcon GGUF without its weights, routed to transformers: `specfill generate` says so in one
    line of its own; transformers' warnings, its load report (a table of the missing weights) and its
    GGUF conversion bar used to come first, and the model ran with the missing weights at random."""
    import gguf

    from specfill.cli.main import main

    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert main(["generate", "--backend", "cuda", "--model", str(path), "--prompt", "hi", "--max-tokens", "2"]) == 2
    out, err = capfd.readouterr()  # the file descriptors: transformers logs to the stderr it saw first
    lines = [line for line in err.splitlines() if "no CUDA GPU found" not in line]
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("specfill: error: ") and "weights are missing from the checkpoint" in lines[0], err
