"""Checkpoint -> (ModelArgs, {Hugging Face name: ndarray}) for a GGUF file or a HF directory.

Output layout is Hugging Face's: Linear weights [out, in], Q/K rows in half-split (rotate-half)
RoPE order (llama.cpp's row permutation of llama Q/K is undone). Arrays are float32, except
tensors stored as float16 (GGUF F16, safetensors F16), which stay float16 to halve memory;
quantized GGUF tensors are dequantized. `lm_head.weight` is absent when embeddings are tied.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ModelLoadError, quote
from ..models import ModelArgs, expected_tensor_shapes
from ..rope import llama3_scaling_from_factors
from .gguf_file import GGUF_MAGIC, GGUFFile, GGUFTensorInfo, existing_path, read_gguf, regular_file, tensor_array
from .random_model import is_random_model, load_random_model

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 names its four norms differently (llama.cpp's ffn_norm is the pre-MLP norm there too)
_GEMMA3_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Tensors llama.cpp writes that carry no weights of their own (rope_freqs is read separately).
_SKIPPED_GGUF = re.compile(r"^(rope_freqs\.weight|blk\.\d+\.attn_rot_embd\.weight)$")
_SKIPPED_HF = re.compile(r"^model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$")
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def gguf_to_hf_name(name: str, architecture: str = "llama") -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for tensors to
    skip (rope_freqs); ModelLoadError for a tensor no supported architecture has."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    if _SKIPPED_GGUF.match(name):
        return None
    names = _GEMMA3_BLOCK_NAMES if architecture == "gemma3" else _BLOCK_NAMES
    match = _BLOCK.match(name)
    if match is None or match.group(2) not in names:
        raise ModelLoadError(f"unexpected GGUF tensor {name!r} (not part of a supported {architecture} model)")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"


def norms_as_multipliers(args: ModelArgs, weights: dict[str, Any]) -> None:
    """Gemma 3 checkpoints in HF form store RMSNorm weights w applied as x * (1 + w); llama.cpp's
    GGUF stores 1 + w. In place, HF-form weights become 1 + w, so that every family's norm
    multiplies by its weight (NumPy or MLX arrays). Other families are left alone."""
    if args.architecture == "gemma3":
        for name in [n for n in weights if n.endswith("norm.weight")]:
            weights[name] = weights[name] + 1


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's llama Q/K row permutation (interleaved -> half-split RoPE pairs);
    n_heads is the head count for Q and the KV head count for K. Works on weights and biases."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's permutation (the inverse of unpermute_qk), as its convert script applies it."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_tensors(args: ModelArgs, shapes: Mapping[str, tuple[int, ...]], source: Path | str) -> None:
    """One ModelLoadError naming missing, unexpected or mis-shaped tensors ({name: shape})."""
    layers = {int(m.group(1)) for name in shapes if (m := _HF_LAYER.match(name))}
    if len(layers) != args.num_hidden_layers:  # also keeps a corrupt count from looping long
        raise ModelLoadError(f"{source} declares {args.num_hidden_layers} layers but holds tensors for {len(layers)}")
    expected = expected_tensor_shapes(args)

    def listed(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")

    missing = [n for n in expected if n not in shapes]
    if missing:
        raise ModelLoadError(f"{source} is missing {len(missing)} tensors: {listed(missing)}")
    extra = sorted(n for n in shapes if n not in expected)
    if extra:
        raise ModelLoadError(
            f"{source} has tensors a {args.architecture} model does not use (unsupported variant?): {listed(extra)}"
        )
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise ModelLoadError(f"tensor {name} in {source} has shape {tuple(shapes[name])}, expected {shape}")


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """GGUF key/values as Python values (strings decoded, arrays as lists)."""
    with read_gguf(path) as gguf_file:
        return gguf_file.metadata


def load_weights(path: str | os.PathLike[str]) -> tuple[ModelArgs, dict[str, np.ndarray]]:
    """A GGUF file or a HF directory (config.json + model.safetensors or a sharded index), or
    "random:NAME" (random weights of a known shape, see core.io.random_model)."""
    if is_random_model(path):
        return load_random_model(path)
    path = checkpoint_path(path)
    if path.is_dir():
        return _load_hf_directory(path)
    with read_gguf(path) as gguf_file:
        args, weights = _load_gguf(gguf_file)
    _check_finite(weights, path)
    return args, weights


def checkpoint_path(path: str | os.PathLike[str]) -> Path:
    """The path of a model directory or GGUF file; ModelLoadError for any other (or a missing) path."""
    path = existing_path(path)
    if not path.is_dir() and not is_gguf_file(path):
        raise ModelLoadError(f"{quote(path)} is not a GGUF file (bad magic) nor a model directory")
    return path


def is_gguf_file(path: Path) -> bool:
    """Whether a regular file (anything else is refused: a FIFO would block) starts with GGUF's magic."""
    with open(regular_file(path), "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _check_finite(weights: Mapping[str, np.ndarray], source: Path) -> None:
    for name, w in weights.items():
        if not np.isfinite(w).all():
            raise ModelLoadError(f"tensor {name} in {source} holds NaN or Inf values")


def gguf_model(gguf_file: GGUFFile) -> tuple[ModelArgs, dict[str, GGUFTensorInfo]]:
    """The args and the checked tensor table under HF names; reads no tensor data but rope_freqs."""
    tensors = gguf_file.tensors
    args = ModelArgs.from_gguf_metadata(gguf_file.metadata, "output.weight" in tensors)
    rope_dims = gguf_file.metadata.get(f"{args.architecture}.rope.dimension_count", args.head_dim)
    if rope_dims != args.head_dim:
        raise ModelLoadError(
            f"RoPE on {rope_dims} of {args.head_dim} head dimensions (partial rotary) is not supported"
        )
    infos = {hf: tensors[name] for name in tensors if (hf := gguf_to_hf_name(name, args.architecture)) is not None}
    if "rope_freqs.weight" in tensors:
        factors = tensor_array(gguf_file, tensors["rope_freqs.weight"])
        args = dataclasses.replace(
            args, rope_scaling=llama3_scaling_from_factors(factors, args.head_dim, args.rope_theta)
        )
    embed = infos.get("model.embed_tokens.weight")
    args = dataclasses.replace(  # the tensors, not the metadata, decide these two
        args,
        attention_bias="model.layers.0.self_attn.q_proj.bias" in infos,
        vocab_size=embed.shape[0] if embed is not None else args.vocab_size,
    )
    check_tensors(args, {name: info.shape for name, info in infos.items()}, gguf_file.path)
    return args, infos


def gguf_qk_heads(args: ModelArgs, name: str) -> int | None:
    """Heads to un-permute tensor `name` (HF name) of a GGUF by, or None: only llama's convert permutes."""
    parts = {".self_attn.q_proj.": args.num_attention_heads, ".self_attn.k_proj.": args.num_key_value_heads}
    return next((n for part, n in parts.items() if part in name and args.architecture == "llama"), None)


def _load_gguf(gguf_file: GGUFFile) -> tuple[ModelArgs, dict[str, np.ndarray]]:
    args, infos = gguf_model(gguf_file)
    weights = {name: tensor_array(gguf_file, info) for name, info in infos.items()}
    return args, {
        name: w if (heads := gguf_qk_heads(args, name)) is None else unpermute_qk(w, heads)
        for name, w in weights.items()
    }


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; anything else is a one-line ModelLoadError."""
    try:
        with open(regular_file(path, "JSON file"), encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: bad JSON, a 5000-digit number
        raise ModelLoadError(f"cannot read {quote(path)}: {err}") from None
    except RecursionError:
        raise ModelLoadError(f"cannot read {quote(path)}: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{quote(path)} does not hold a JSON object")
    return value


def safetensors_files(directory: Path) -> list[Path]:
    """The shards named by model.safetensors.index.json, else model.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no weight_map")
        names = set(weight_map.values())
        if not all(isinstance(n, str) and n and Path(n).name == n for n in names):
            raise ModelLoadError(f"{index} weight_map must map to shard file names in {quote(directory)}")
        files = [directory / name for name in sorted(names)]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ModelLoadError(f"{index} names shards that are missing: {', '.join(absent)}")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    raise ModelLoadError(f"{quote(directory)} has no model.safetensors or model.safetensors.index.json")


def quant_method(config: Mapping[str, Any]) -> Any:
    """The method a config's `quantization_config` (GPTQ, AWQ, bitsandbytes...) names, or "unknown"."""
    entry = config.get("quantization_config")
    return entry.get("quant_method", "unknown") if isinstance(entry, Mapping) else "unknown"


def _refuse_quantized(config: Mapping[str, Any], directory: Path) -> None:
    """GPTQ / AWQ / bitsandbytes (`quantization_config`) and mlx-lm (`quantization`) directories
    store packed integer weights that this loader would misread as plain matrices."""
    if "quantization_config" in config:
        raise ModelLoadError(
            f"{quote(directory)} is quantized with {quant_method(config)!r}, which is not supported here "
            "(use a GGUF file or an unquantized safetensors checkpoint)"
        )
    if config.get("quantization") not in (None, {}):  # null or {} quantizes nothing (as on the MLX backend)
        raise ModelLoadError(
            f"{quote(directory)} is an mlx-lm quantized checkpoint: load it with the mlx backend, "
            "or use a GGUF file or an unquantized safetensors checkpoint"
        )


def _load_hf_directory(directory: Path) -> tuple[ModelArgs, dict[str, np.ndarray]]:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{quote(directory)} is not a model directory: it has no config.json")
    config = read_json_object(config_path)
    args = ModelArgs.from_hf_config(config)
    _refuse_quantized(config, directory)
    from .safetensors_file import read_safetensors  # directories only: a GGUF run never imports it

    weights: dict[str, np.ndarray] = {}
    for file in safetensors_files(directory):
        weights.update(read_safetensors(file))
    for name in [n for n in weights if _SKIPPED_HF.match(n)]:
        del weights[name]
    if args.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # some tied checkpoints store the shared copy
    check_tensors(args, {name: w.shape for name, w in weights.items()}, directory)
    _check_finite(weights, directory)
    norms_as_multipliers(args, weights)
    return args, weights
