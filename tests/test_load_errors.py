"""Every bad checkpoint gives one ModelLoadError whose message names the problem."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest

from specfill.core.errors import ModelLoadError
from specfill.core.io.weights import gguf_to_hf_name, load_weights, read_gguf_metadata
from tests.fixtures import tiny_model_args, tiny_weights, write_gguf_file


def expect_error(path, *words):
    with pytest.raises(ModelLoadError) as info:
        load_weights(path)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def test_missing_path(tmp_path):
    expect_error(tmp_path / "nope.gguf", "does not exist", "nope.gguf")


@pytest.mark.parametrize("content", [b"", b"GG", b"PK\x03\x04 a zip, not a model", b"ggufGGUF"])
def test_not_a_gguf(tmp_path, content):
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    expect_error(path, "not a GGUF", "bad magic")
    with pytest.raises(ModelLoadError, match="bad magic"):
        read_gguf_metadata(path)


@pytest.mark.parametrize("keep", [4, 10, 23, 200, 2000, -1])
def test_truncated_gguf(tmp_path, tiny_checkpoint, keep):
    data = tiny_checkpoint("qwen2", "gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])  # header, metadata, tensor table, or last tensor cut short
    expect_error(path, "truncated", "cut.gguf")


def test_corrupt_gguf_counts_and_types(tmp_path, tiny_checkpoint):
    data = bytearray(tiny_checkpoint("llama", "gguf").read_bytes())
    path = tmp_path / "bad.gguf"
    path.write_bytes(data[:4] + (7).to_bytes(4, "little") + data[8:])
    expect_error(path, "unsupported GGUF version 7")
    path.write_bytes(data[:8] + (1 << 40).to_bytes(8, "little") + data[16:])
    expect_error(path, "corrupt")
    first_key_len = int.from_bytes(data[24:32], "little")
    type_at = 32 + first_key_len
    path.write_bytes(data[:type_at] + (99).to_bytes(4, "little") + data[type_at + 4 :])
    expect_error(path, "corrupt", "value type 99")


def _minimal_gguf(path, arch, tensors):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    for name, (array, qtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unknown_architecture(tmp_path):
    path = _minimal_gguf(tmp_path / "falcon.gguf", "falcon", {})
    message = expect_error(path, "unsupported architecture 'falcon'", "llama", "qwen2", "qwen3")
    assert "falcon" in message


def test_a_changed_type_id_is_refused(tmp_path):
    """Q8_0 -> Q8_1 (both valid ids): the tensor's byte size changes, so it overlaps its neighbour."""
    args = tiny_model_args("llama")
    base = write_gguf_file(tmp_path / "base.gguf", args, tiny_weights(args, quant="Q8_0"))
    name = "blk.0.attn_q.weight"
    data = bytearray(base.read_bytes())
    # a tensor-info entry is: name, n_dims (u32), dims (u64 each), type (u32), offset (u64)
    at = data.index(name.encode()) + len(name) + 4 + 8 * 2
    assert int.from_bytes(data[at : at + 4], "little") == gguf.GGMLQuantizationType.Q8_0
    data[at : at + 4] = int(gguf.GGMLQuantizationType.Q8_1).to_bytes(4, "little")
    path = tmp_path / "q81.gguf"
    path.write_bytes(bytes(data))
    expect_error(path, "corrupt", "overlaps", name)


def test_unsupported_quant_type_is_named(tmp_path):
    from specfill.core.io.gguf_file import read_gguf, tensor_array

    name = "blk.0.attn_q.weight"
    packed = np.zeros((4, 64 // 32 * 40), np.uint8)  # Q8_1: 40 bytes per block of 32
    path = _minimal_gguf(tmp_path / "q81.gguf", "llama", {name: (packed, gguf.GGMLQuantizationType.Q8_1)})
    with read_gguf(path) as f, pytest.raises(ModelLoadError, match=f"{name}.*Q8_1.*cannot dequantize"):
        tensor_array(f, f.tensors[name])


@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
def test_missing_tensor(tmp_path, tiny_checkpoint, fmt):
    args = tiny_model_args("qwen3")
    weights = tiny_weights(args)
    del weights["model.layers.1.self_attn.k_norm.weight"]
    if fmt == "gguf":
        path = write_gguf_file(tmp_path / "missing.gguf", args, weights)
    else:
        path = tmp_path / "missing"
        shutil.copytree(tiny_checkpoint("qwen3", "safetensors"), path)
        from safetensors.numpy import save_file

        save_file(weights, str(path / "model.safetensors"))
    expect_error(path, "missing 1 tensors", "model.layers.1.self_attn.k_norm.weight")


def test_unexpected_and_misshaped_tensors(tmp_path, tiny_checkpoint):
    from safetensors.numpy import save_file

    path = tmp_path / "extra"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    weights = tiny_weights(tiny_model_args("llama"))
    save_file(
        dict(weights, **{"model.layers.0.mlp.up_proj.bias": np.zeros(128, np.float32)}), str(path / "model.safetensors")
    )
    expect_error(path, "does not use", "model.layers.0.mlp.up_proj.bias")
    weights["model.norm.weight"] = np.ones(32, np.float32)
    save_file(weights, str(path / "model.safetensors"))
    expect_error(path, "model.norm.weight", "shape (32,)", "expected (64,)")
    with pytest.raises(ModelLoadError, match="unexpected GGUF tensor 'blk.0.ffn_gate_exps.weight'"):
        gguf_to_hf_name("blk.0.ffn_gate_exps.weight")


def test_directory_without_config_or_weights(tmp_path, tiny_checkpoint):
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_error(empty, "no config.json", "empty")
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), no_weights)
    (no_weights / "model.safetensors").unlink()
    expect_error(no_weights, "no model.safetensors", "no_weights")


def test_bad_config_json(tmp_path, tiny_checkpoint):
    path = tmp_path / "badcfg"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    (path / "config.json").write_text("{not json")
    expect_error(path, "config.json")
    config = json.loads((tiny_checkpoint("llama", "safetensors") / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, model_type="gpt2", architectures=["GPT2LMHeadModel"])))
    expect_error(path, "unsupported architecture 'gpt2'", "qwen3")
    del config["hidden_size"]
    (path / "config.json").write_text(json.dumps(config))
    expect_error(path, "config.json lacks 'hidden_size'")


def test_sharded_directory_and_truncated_shard(tmp_path, tiny_checkpoint):
    from safetensors.numpy import save_file

    path = tmp_path / "sharded"
    shutil.copytree(tiny_checkpoint("qwen2", "safetensors"), path)
    (path / "model.safetensors").unlink()
    weights = tiny_weights(tiny_model_args("qwen2"))
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for file, part in shards.items():
        save_file({n: weights[n] for n in part}, str(path / file))
    index = {"weight_map": {n: file for file, part in shards.items() for n in part}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    _, loaded = load_weights(path)
    assert sorted(loaded) == names
    shard = path / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    expect_error(path, "truncated", "model-00002-of-00002.safetensors")
    shard.unlink()
    expect_error(path, "missing", "model-00002-of-00002.safetensors")


def test_corrupted_header_bytes_never_escape_as_other_errors(tmp_path, tiny_checkpoint):
    """Flip bytes anywhere in the header (metadata and tensor table): the loader either loads
    or raises ModelLoadError, never an IndexError/ValueError/MemoryError from deep inside."""
    from specfill.core.io.gguf_file import read_gguf

    source = tiny_checkpoint("qwen3", "gguf")
    data = source.read_bytes()
    with read_gguf(source) as f:
        header_end = min(info.offset for info in f.tensors.values())
    rng = np.random.default_rng(0)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"loaded": 0, "rejected": 0}
    for _ in range(300):
        corrupt = bytearray(data)
        for at in rng.integers(4, header_end, size=int(rng.integers(1, 4))):
            corrupt[at] = int(rng.integers(0, 256))
        path.write_bytes(bytes(corrupt))
        try:
            load_weights(path)
            outcomes["loaded"] += 1
        except ModelLoadError as err:
            assert "\n" not in str(err)
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 0


def test_nan_weights_are_rejected(tmp_path, tiny_checkpoint):
    from safetensors.numpy import save_file

    path = tmp_path / "nan"
    shutil.copytree(tiny_checkpoint("qwen2", "safetensors"), path)
    weights = tiny_weights(tiny_model_args("qwen2"))
    weights["model.layers.1.mlp.down_proj.weight"][3, 5] = np.nan
    save_file(weights, str(path / "model.safetensors"))
    expect_error(path, "model.layers.1.mlp.down_proj.weight", "NaN")


def test_gguf_tokenizer_with_a_bad_merge(tmp_path):
    from specfill.core.io.tokenizer import load_tokenizer

    path = tmp_path / "badmerge.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b", "x y"])  # x, y are not tokens
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    with pytest.raises(ModelLoadError, match="GGUF tokenizer is invalid"):
        load_tokenizer(path)


@pytest.mark.parametrize(
    "entry,words",
    [
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, ("quantized with 'gptq'", "GGUF")),
        ({"quantization_config": {"quant_method": "awq"}}, ("quantized with 'awq'",)),
        ({"quantization": {"group_size": 64, "bits": 4}}, ("mlx-lm quantized", "mlx backend")),
    ],
)
def test_quantized_hf_directories_are_refused_by_name(tmp_path, tiny_checkpoint, entry, words):
    """Their packed integer weights must never be read as plain matrices."""
    path = tmp_path / "quantized"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **entry}))
    expect_error(path, *words)
