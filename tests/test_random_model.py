"""random:SHAPE models: shapes, seeded weights, the id tokenizer, loading on both backends, the
benchmark on them and the GPU-session script's smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specfill.cli.main import main
from specfill.core import ModelLoadError
from specfill.core.io.random_model import RANDOM_SHAPES, random_model_args, random_weights
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.io.weights import load_weights
from specfill.core.models import expected_tensor_shapes

ROOT = Path(__file__).resolve().parents[1]


def test_llama_1b_shape_is_llama_3_2_1b():
    args = random_model_args("random:llama-1b")
    assert (
        args.num_hidden_layers,
        args.hidden_size,
        args.num_attention_heads,
        args.num_key_value_heads,
        args.head_dim,
        args.vocab_size,
    ) == (16, 2048, 32, 8, 64, 128256)
    assert args.rope_theta == 500000.0 and args.rope_scaling["rope_type"] == "llama3"
    assert args.tie_word_embeddings


@pytest.mark.parametrize("name", sorted(RANDOM_SHAPES))
def test_every_shape_builds_its_args(name):
    args = random_model_args("random:" + name)
    assert args.architecture == RANDOM_SHAPES[name]["model_type"]


def test_weights_are_seeded_and_complete():
    args, weights = load_weights("random:tiny-llama")
    assert {k: v.shape for k, v in weights.items()} == expected_tensor_shapes(args)
    again = random_weights(args, seed=0)
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert not np.array_equal(
        weights["model.embed_tokens.weight"], random_weights(args, seed=1)["model.embed_tokens.weight"]
    )
    assert np.all(weights["model.norm.weight"] == 1.0)
    assert 0.015 < weights["model.layers.0.mlp.up_proj.weight"].std() < 0.025


def test_unknown_shape_is_a_load_error_listing_the_known_ones(capsys):
    with pytest.raises(ModelLoadError, match="random:llama-1b"):
        load_weights("random:llama-70b")
    assert main(["generate", "--model", "random:nope", "--prompt", "1 2"]) == 2
    assert "unknown random-weight shape 'nope'" in capsys.readouterr().err


def test_id_tokenizer_round_trips_ids():
    tokenizer = load_tokenizer("random:tiny-llama")
    assert tokenizer.vocab_size == 512 and not tokenizer.eos_token_ids
    assert tokenizer.encode("5 17 300") == [5, 17, 300]
    assert tokenizer.decode([5, 17, 300]) == "5 17 300"
    assert tokenizer.encode("hello 9") == [0, 9]  # an unknown word reads as id 0


def test_both_backends_load_the_same_random_model():
    pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    from specfill.api import load, prefill_method
    from specfill.core.runtime import GenerationInfo

    logits = []
    for backend, device in (("cuda", "cpu"), ("mlx", None)):
        model, _ = load("random:tiny-llama", backend=backend, dtype="float32", device=device)
        logits.append(
            np.asarray(model.prompt_logits([5, 17, 300, 2], method=prefill_method("full"), info=GenerationInfo()))
        )
    assert logits[0].shape == (4, 512) and np.abs(logits[0] - logits[1]).max() < 1e-4


def test_bench_on_a_random_model_uses_random_ids(tmp_path, capsys):
    pytest.importorskip("torch")
    code = main(
        [
            "bench",
            "--backends",
            "cuda",
            "--device",
            "cpu",
            "--model",
            "random:tiny-llama",
            "--lengths",
            "40",
            "--methods",
            "full,specprefill",
            "--speculator",
            "self:1",
            "--select-chunk",
            "4",
            "--decode-tokens",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["method"], r["prompt_tokens"]) for r in rows] == [("full", 40), ("specprefill", 40)]
    # keep 0.3 of 40 = three chunks of 4, plus the last token unless one of them holds it
    assert rows[1]["kept_tokens"] in (12, 13) and rows[0]["kept_tokens"] == 40


def test_gpu_session_script_smoke_run(tmp_path):
    """The script a GPU session runs, end to end on the CPU with a tiny random model."""
    pytest.importorskip("torch")
    env = {
        **os.environ,
        "MODEL": "random:tiny-llama",
        "LENGTHS": "48",
        "DEVICE": "cpu",
        "DTYPE": "float32",
        "SPECULATOR": "self:1",
        "KERNELS": "off",
        "TESTS": "tests/torch_cuda/test_attention.py",
        "NAME": "smoke",
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_session.sh")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all passed" in proc.stdout
    assert json.loads((tmp_path / "conformance-cuda.json").read_text())["passed"] is True
    assert {r["method"] for r in json.loads((tmp_path / "smoke.json").read_text())["rows"]} == {
        "full",
        "h2o",
        "specprefill",
    }
    assert "passed" in (tmp_path / "tests.log").read_text()
