"""One truth about projection biases: `ModelArgs.biased_projections` (Hugging Face's rule per
family) decides which biases a checkpoint must hold and which layers both backends build.

A Llama / Qwen3 checkpoint with `attention_bias` carries q, k, v AND o biases; Qwen2 biases
q, k, v only. Each case loads transformers' own random model (every bias non-zero) through our
loaders (safetensors directory and GGUF) on both backends and compares logits with
transformers'.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.models import ModelArgs, expected_tensor_shapes

QKV, QKVO = ("q_proj", "k_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj")
CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


@pytest.mark.parametrize(
    "model_type,attention_bias,expected",
    [
        ("llama", False, ()),
        ("llama", True, QKVO),
        ("qwen3", True, QKVO),
        ("qwen3", None, ()),
        ("qwen2", None, QKV),
        ("qwen2", True, QKV),
    ],
)
def test_biased_projections_follow_hugging_face(model_type, attention_bias, expected):
    config = {**CONFIG, "model_type": model_type}
    if attention_bias is not None:
        config["attention_bias"] = attention_bias
    args = ModelArgs.from_hf_config(config)
    assert args.biased_projections == expected
    biases = {
        name.split(".")[-2]
        for name in expected_tensor_shapes(args)
        if name.startswith("model.layers.0.") and name.endswith(".bias")
    }
    assert biases == set(expected)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_attention_bias_checkpoint_matches_transformers_on_both_backends(tmp_path, arch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    mx = pytest.importorskip("mlx.core")
    from specfill.backends.mlx.loader import build_model
    from specfill.backends.mlx.weights import load_checkpoint, to_dtype
    from specfill.backends.torch_cuda import from_weights
    from specfill.core.io.weights import load_weights
    from tests.fixtures import write_gguf_file
    from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

    torch.set_num_threads(1)
    tiny = make_tiny(arch, seed=7, attention_bias=True)
    hf_biases = {
        n.split(".")[-2]
        for n, _ in tiny.hf.named_parameters()
        if n.startswith("model.layers.0.") and n.endswith(".bias")
    }
    assert tiny.args.biased_projections == QKVO and hf_biases == set(QKVO)
    directory = tmp_path / "hf"
    tiny.hf.save_pretrained(directory, safe_serialization=True)
    gguf_path = write_gguf_file(
        tmp_path / "tiny.gguf",
        replace(tiny.args, bos_token_id=1, eos_token_ids=(2,)),
        {k: v.astype(np.float32) for k, v in tiny.weights.items()},
        quant="F32",
    )
    ids = prompt_ids(24, seed=7)
    want = tiny.hf_logits(ids)[0].numpy()
    for source in (directory, gguf_path):
        args, weights = load_weights(source)
        assert args.biased_projections == QKVO, source
        ours = from_weights(args, weights, dtype=torch.float32, device="cpu")(ids)[0].numpy()
        assert np.abs(ours - want).max() <= 1e-4, f"torch from {source.name}"
        model = build_model(to_dtype(load_checkpoint(source), mx.float32, dequantize=True))
        assert "bias" in model.layers[0].self_attn.o_proj
        logits = np.asarray(model(mx.array([ids]))[0])
        assert np.abs(logits - want).max() <= 1e-4, f"mlx from {source.name}"
