"""core.io.weights: GGUF and HF directories load to the same HF-named arrays, checked against the
fixtures' own values and against transformers; name map and Q/K un-permute; rope_freqs."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.io.gguf_file import read_gguf, tensor_array
from specfill.core.io.weights import gguf_to_hf_name, load_weights, permute_qk, read_gguf_metadata, unpermute_qk
from specfill.core.models import ModelArgs, expected_tensor_shapes
from specfill.core.rope import llama3_freq_factors, llama3_scaling_from_factors, rope_inv_freq
from tests.fixtures import ARCHITECTURES, LLAMA3_ROPE, hf_to_gguf_name, llama_cpp_permute, tiny_model_args, tiny_weights


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_both_formats_load_the_fixture_values(tiny_checkpoint, arch):
    expected_args = tiny_model_args(arch)
    expected = tiny_weights(expected_args)
    for fmt in ("gguf", "safetensors"):
        args, weights = load_weights(tiny_checkpoint(arch, fmt))
        assert args == expected_args, fmt
        assert sorted(weights) == sorted(expected), fmt
        for name, w in expected.items():
            assert weights[name].dtype == w.dtype, (fmt, name)
            np.testing.assert_array_equal(weights[name], w, err_msg=f"{fmt} {name}")


@pytest.mark.parametrize("quant", ["Q4_0", "Q5_1", "BF16", "F16"])
def test_gguf_types_dequantize_to_the_safetensors_values(tiny_checkpoint, quant):
    _, gguf_weights = load_weights(tiny_checkpoint("llama", "gguf", quant=quant))
    _, hf_weights = load_weights(tiny_checkpoint("llama", "safetensors", quant=quant))
    for name, w in hf_weights.items():
        np.testing.assert_array_equal(gguf_weights[name], w, err_msg=name)
    # the rounding really happened: a 4-bit matrix is far from the unrounded random values
    raw = tiny_weights(tiny_model_args("llama"), quant="F32")["model.layers.0.self_attn.q_proj.weight"]
    error = np.abs(gguf_weights["model.layers.0.self_attn.q_proj.weight"] - raw).max()
    assert (error > 1e-3) if quant in ("Q4_0", "Q5_1") else (error < 2e-2)


def test_gguf_stores_llama_qk_permuted_and_the_loader_undoes_it(tiny_checkpoint):
    args = tiny_model_args("llama")
    path = tiny_checkpoint("llama", "gguf")
    hf = tiny_weights(args)
    with read_gguf(path) as f:
        stored_q = tensor_array(f, f.tensors["blk.1.attn_q.weight"])
        stored_k = tensor_array(f, f.tensors["blk.1.attn_k.weight"])
    q, k = hf["model.layers.1.self_attn.q_proj.weight"], hf["model.layers.1.self_attn.k_proj.weight"]
    assert not np.array_equal(stored_q, q)
    np.testing.assert_array_equal(stored_q, llama_cpp_permute(q, args.num_attention_heads))
    np.testing.assert_array_equal(stored_k, llama_cpp_permute(k, args.num_key_value_heads))
    np.testing.assert_array_equal(unpermute_qk(stored_q, args.num_attention_heads), q)


@pytest.mark.parametrize("rows,cols,heads", [(64, 8, 4), (192, 5, 3), (576, 2, 9), (12, 1, 1)])
def test_unpermute_inverts_llama_cpp_permute(rows, cols, heads):
    w = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)
    np.testing.assert_array_equal(permute_qk(w, heads), llama_cpp_permute(w, heads))
    bias = w[:, 0].copy()
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(bias, heads), heads), bias)
    # one head: pairs (2j, 2j+1) of the interleaved layout go to rows j and j + d/2
    head = unpermute_qk(np.arange(8.0), 1)
    assert head.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_name_map_inverts_the_writer_names(arch):
    for name in expected_tensor_shapes(tiny_model_args(arch)):
        assert gguf_to_hf_name(hf_to_gguf_name(name)) == name
    assert gguf_to_hf_name("rope_freqs.weight") is None
    assert gguf_to_hf_name("blk.0.ffn_up.weight") == "model.layers.0.mlp.up_proj.weight"


def test_metadata_reads_python_values(tiny_checkpoint):
    meta = read_gguf_metadata(tiny_checkpoint("qwen3", "gguf"))
    assert meta["general.architecture"] == "qwen3"
    assert meta["qwen3.attention.key_length"] == 32
    assert meta["qwen3.attention.layer_norm_rms_epsilon"] == 1e-6
    assert meta["tokenizer.ggml.tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert meta["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 1]
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert isinstance(meta["tokenizer.chat_template"], str)


def test_llama3_rope_scaling_recovered_from_rope_freqs(tiny_checkpoint):
    gguf_args, weights = load_weights(tiny_checkpoint("llama", "gguf", llama3_rope=True))
    hf_args, _ = load_weights(tiny_checkpoint("llama", "safetensors", llama3_rope=True))
    assert gguf_args.rope_scaling == hf_args.rope_scaling == LLAMA3_ROPE
    assert not any("rope" in name for name in weights)
    # Llama 3.1 8B's own numbers: head_dim 128, theta 500000, factor 8, context 8192
    real = dict(LLAMA3_ROPE, original_max_position_embeddings=8192)
    assert llama3_scaling_from_factors(llama3_freq_factors(128, 500000.0, real), 128, 500000.0) == real
    assert llama3_scaling_from_factors(np.ones(64), 128, 500000.0) is None


def test_rope_inv_freq_applies_llama3_scaling():
    args = tiny_model_args("llama", llama3_rope=True)
    base = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    scaled = rope_inv_freq(args)
    wavelen = 2 * np.pi / base
    np.testing.assert_allclose(scaled[wavelen < 2048 / 4], base[wavelen < 2048 / 4], rtol=1e-6)
    np.testing.assert_allclose(scaled[wavelen > 2048], base[wavelen > 2048] / 8, rtol=1e-6)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_transformers_loads_the_same_state_dict(tiny_checkpoint, arch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    directory = tiny_checkpoint(arch, "safetensors")
    args, ours = load_weights(directory)
    sources = [transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)]
    if arch != "qwen3":  # transformers' GGUF config mapping drops qwen3's key_length (head_dim)
        gguf_path = tiny_checkpoint(arch, "gguf")
        sources.append(
            transformers.AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
        )
    for model in sources:
        theirs = {k: v.numpy() for k, v in model.state_dict().items()}
        if args.tie_word_embeddings:  # transformers lists the tied head under its own name
            np.testing.assert_array_equal(
                theirs.pop("lm_head.weight"), ours["model.embed_tokens.weight"].astype(np.float32)
            )
        assert sorted(theirs) == sorted(ours)
        for name, w in ours.items():
            np.testing.assert_array_equal(theirs[name], w.astype(np.float32), err_msg=name)
        assert model.config.tie_word_embeddings == args.tie_word_embeddings


def test_demo_model_loads_with_the_documented_shape():
    from specfill.core.errors import ModelLoadError
    from specfill.core.io.demo_model import require_demo_model

    try:
        path = require_demo_model()
    except ModelLoadError as err:
        pytest.skip(f"demo model not downloaded ({err})")
    args, weights = load_weights(path)
    assert args == ModelArgs(
        architecture="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        rope_scaling=None,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attention_bias=False,
        qk_norm=False,
        bos_token_id=1,
        eos_token_ids=(2,),
    )
    assert len(weights) == 2 + 9 * 30 and "lm_head.weight" not in weights
    for w in weights.values():
        assert w.dtype == np.float32 and np.isfinite(w).all()
    norms = np.linalg.norm(weights["model.layers.0.self_attn.q_proj.weight"], axis=1)
    assert norms.min() > 0  # Q4_1 rows dequantized to real values, not zeros


@pytest.mark.slow
def test_demo_model_equals_transformers_gguf_loader():
    """transformers dequantizes and un-permutes the demo GGUF itself: every array must match."""
    from specfill.core.errors import ModelLoadError
    from specfill.core.io.demo_model import require_demo_model

    try:
        path = require_demo_model()
    except ModelLoadError as err:
        pytest.skip(f"demo model not downloaded ({err})")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    _, ours = load_weights(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    theirs = model.state_dict()
    assert sorted(theirs) == sorted([*ours, "lm_head.weight"])
    for name, w in ours.items():
        np.testing.assert_array_equal(theirs[name].numpy(), w, err_msg=name)


def test_bfloat16_safetensors_widen_exactly(tmp_path, tiny_checkpoint):
    import shutil

    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    path = tmp_path / "bf16"
    shutil.copytree(tiny_checkpoint("qwen3", "safetensors"), path)
    weights = {
        k: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
        for k, v in tiny_weights(tiny_model_args("qwen3")).items()
    }
    save_file(weights, str(path / "model.safetensors"))
    _, loaded = load_weights(path)
    for name, w in weights.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], w.float().numpy(), err_msg=name)


def test_hf_config_rope_keys_old_and_new():
    from tests.fixtures import hf_config

    base = hf_config(tiny_model_args("llama"))
    del base["rope_theta"]
    v5 = dict(base, rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0))
    args = ModelArgs.from_hf_config(v5)  # transformers >= 5 writes rope_parameters
    assert args.rope_theta == 500000.0 and args.rope_scaling == LLAMA3_ROPE
    default = ModelArgs.from_hf_config(dict(base, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    assert default.rope_theta == 1e6 and default.rope_scaling is None
    legacy = ModelArgs.from_hf_config(dict(base, rope_theta=1e4, rope_scaling={"type": "linear", "factor": 2.0}))
    assert legacy.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    np.testing.assert_allclose(rope_inv_freq(legacy), 1e4 ** (-np.arange(0, 16, 2) / 16) / 2, rtol=1e-6)
