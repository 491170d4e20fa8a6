"""Checkpoints -> MLX arrays with Hugging Face names, quantized layers kept quantized.

Three sources, one result (`Checkpoint`):
- GGUF through `gguf_checkpoint` (not `mx.load`, which mis-reads Q4_K): Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/
  Q4_K/Q5_K become MLX affine triples (packed `weight`, `scales`, `biases`; group 32) holding the
  file's own codes; other types are dequantized by gguf-py to float; a spot check per type against
  gguf's reference runs at load. llama.cpp's Q/K row permutation is undone on all three arrays:
  a row permutation commutes with per-row group quantization.
- Hugging Face safetensors directories (config.json + model*.safetensors).
- mlx-lm directories: the same, with a `quantization` entry in config.json.
Names, tensor checks and RoPE recovery come from the backend-neutral specfill.core.io.weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from specfill.core.errors import ModelLoadError, quote
from specfill.core.io.gguf_file import read_gguf
from specfill.core.io.random_model import is_random_model
from specfill.core.io.weights import (
    check_tensors,
    checkpoint_path,
    load_weights,
    norms_as_multipliers,
    quant_method,
    read_json_object,
    safetensors_files,
    unpermute_qk,
)
from specfill.core.models import ModelArgs

from .gguf_checkpoint import read_arrays, say_float_types

GGUF_GROUP_SIZE = 32  # every GGUF block type the MLX backend keeps quantized has one scale per 32
_QUANT_PARTS = ("scales", "biases")
_GROUP_SIZES, _BITS = (32, 64, 128), (2, 3, 4, 5, 6, 8)  # what mx.quantize supports
_SKIPPED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class QuantSpec:
    """How one layer's weight is quantized (MLX affine mode: w = scale * q + bias per group)."""

    group_size: int
    bits: int


@dataclass
class Checkpoint:
    """HF-named arrays; a quantized layer `p` has `p.weight` (packed), `p.scales`, `p.biases`, `quantized[p]`."""

    args: ModelArgs
    weights: dict[str, mx.array]
    quantized: dict[str, QuantSpec] = field(default_factory=dict)
    source: str = ""
    float_dtype: mx.Dtype | None = None  # the file's own float type (GGUF: float16 block scales), if not the arrays'


def load_checkpoint(path: str | Path) -> Checkpoint:
    """A GGUF file, or a Hugging Face / mlx-lm safetensors directory, or "random:NAME"."""
    if is_random_model(path):
        return _float_from_core_loader(path)
    path = checkpoint_path(path)
    return _load_directory(path) if path.is_dir() else _load_gguf(path)


def _mx_load(path: Path) -> dict[str, mx.array]:
    """A safetensors shard through mx.load, after the core reader's header checks (the same
    files refused as on the torch backend, and nothing unchecked reaches MLX's C++ reader)."""
    from specfill.core.io.safetensors_file import safetensors_layout  # directories only: GGUF runs skip it

    safetensors_layout(path)
    try:
        return mx.load(str(path))
    except (RuntimeError, ValueError, OSError) as err:
        raise ModelLoadError(f"cannot read {quote(path)} (truncated or corrupt?): {err}") from None


def _logical_shapes(weights: dict[str, mx.array], quantized: dict[str, QuantSpec]) -> dict[str, tuple[int, ...]]:
    """Each weight's unquantized shape ([out, in] for a packed matrix); scales/biases left out."""
    shapes = {}
    for name, w in weights.items():
        module, _, part = name.rpartition(".")
        if module in quantized and part in _QUANT_PARTS:
            continue
        if module in quantized and part == "weight":
            shapes[name] = (w.shape[0], w.shape[1] * 32 // quantized[module].bits)
        else:
            shapes[name] = tuple(w.shape)
    return shapes


def _check_values(weights: dict[str, mx.array], quantized: dict[str, QuantSpec], source: Path) -> None:
    """Every array is a float type except the packed weight of a quantized layer (an integer
    array elsewhere is a mislabelled tensor: garbage weights), and no float holds NaN or Inf."""
    for name, w in weights.items():
        module, _, part = name.rpartition(".")
        if not mx.issubdtype(w.dtype, mx.floating) and not (module in quantized and part == "weight"):
            raise ModelLoadError(f"tensor {name} in {source} has dtype {w.dtype}; expected a float type")
    _check_finite(weights, source)


def _check_finite(weights: dict[str, mx.array], source: Path) -> None:
    """Float tensors (quantization scales and biases included) hold no NaN or Inf."""
    floats = [name for name, w in weights.items() if mx.issubdtype(w.dtype, mx.floating)]
    finite = mx.stack([mx.isfinite(weights[name]).all() for name in floats])
    if not finite.all().item():
        bad = floats[int(mx.argmin(finite.astype(mx.int32)).item())]
        raise ModelLoadError(f"tensor {bad} in {source} holds NaN or Inf values")


def _unpermute_llama_qk(args: ModelArgs, weights: dict[str, mx.array]) -> None:
    """llama.cpp stores llama's Q/K rows interleaved for its RoPE; restore HF's half-split rows
    on the weight (packed or not), its scales/biases and the bias."""
    for i in range(args.num_hidden_layers):
        for proj, heads in (("q_proj", args.num_attention_heads), ("k_proj", args.num_key_value_heads)):
            for part in ("weight", "bias", *_QUANT_PARTS):
                name = f"model.layers.{i}.self_attn.{proj}.{part}"
                if name in weights:  # gather rows by the permutation of their indices
                    rows = weights[name].shape[0]
                    order = mx.array(unpermute_qk(np.arange(rows), heads))
                    weights[name] = weights[name][order]


def _load_gguf(path: Path) -> Checkpoint:
    """Header and tensor table checked by the core reader; tensors decoded by gguf_checkpoint
    (exact MLX affine triples where the codes fit, else gguf's float dequantization) and
    spot-checked against gguf's reference before anything runs."""
    with read_gguf(path) as header:
        arrays = read_arrays(header)
    quantized = {module: QuantSpec(GGUF_GROUP_SIZE, bits) for module, bits in arrays.quantized_bits.items()}
    args = arrays.args
    check_tensors(args, _logical_shapes(arrays.weights, quantized), path)
    _check_values(arrays.weights, quantized, path)
    if args.architecture == "llama":  # only llama's convert permutes; qwen2/3 use NEOX RoPE
        _unpermute_llama_qk(args, arrays.weights)
    say_float_types(arrays, path)
    return Checkpoint(args, arrays.weights, quantized, str(path), float_dtype=mx.float16)


def _float_from_core_loader(path: str | Path) -> Checkpoint:
    """Plain float arrays from the core loader: GGUF types MLX cannot read or represent, random:SHAPE."""
    args, weights = load_weights(path)
    return Checkpoint(args, {name: mx.array(w) for name, w in weights.items()}, {}, str(path))


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{quote(directory)} is not a model directory: it has no config.json")
    return read_json_object(path)


def _mlx_lm_quantization(config: dict[str, Any], weights: dict[str, mx.array], directory: Path) -> dict[str, QuantSpec]:
    """mlx-lm's `quantization` entry: defaults plus per-layer overrides keyed by module path."""
    if "quantization_config" in config and "quantization" not in config:
        raise ModelLoadError(
            f"{quote(directory)} is quantized with {quant_method(config)!r:.40}, which the MLX backend "
            f"does not read (convert it with mlx_lm.convert)"
        )
    entry = config.get("quantization")
    if entry is None or entry == {}:
        return {}
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{quote(directory)}/config.json quantization must be an object, got {entry!r:.40}")
    quantized = {}
    for name in weights:
        module, _, part = name.rpartition(".")
        if part != "scales":
            continue
        spec = entry.get(module, entry)
        if not isinstance(spec, dict) or "bits" not in spec or "group_size" not in spec:
            raise ModelLoadError(
                f"{quote(directory)}/config.json gives no bits/group_size for quantized layer {module}"
            )
        if spec.get("mode", "affine") != "affine":
            raise ModelLoadError(
                f"{quote(directory)}: quantization mode {spec['mode']!r} is not supported (affine only)"
            )
        group, bits = spec["group_size"], spec["bits"]
        if group not in _GROUP_SIZES or bits not in _BITS or isinstance(group, bool) or isinstance(bits, bool):
            raise ModelLoadError(
                f"{quote(directory)}/config.json quantizes {module} with group_size {group!r:.20}, bits "
                f"{bits!r:.20} (MLX takes group sizes {_GROUP_SIZES}, bits {_BITS})"
            )
        quantized[module] = QuantSpec(group, bits)
    return quantized


def _load_directory(directory: Path) -> Checkpoint:
    config = _read_config(directory)
    args = ModelArgs.from_hf_config(config)
    weights: dict[str, mx.array] = {}
    for file in safetensors_files(directory):
        weights.update(_mx_load(file))
    for name in [n for n in weights if n.endswith(_SKIPPED_HF_SUFFIXES)]:
        del weights[name]
    if args.tie_word_embeddings:  # some tied checkpoints store the shared copy
        for part in ("weight", *_QUANT_PARTS):
            weights.pop(f"lm_head.{part}", None)
    quantized = _mlx_lm_quantization(config, weights, directory)
    check_tensors(args, _logical_shapes(weights, quantized), directory)
    _check_values(weights, quantized, directory)
    norms_as_multipliers(args, weights)
    return Checkpoint(args, weights, quantized, str(directory))


def to_dtype(checkpoint: Checkpoint, dtype: mx.Dtype, *, dequantize: bool) -> Checkpoint:
    """Float arrays cast to `dtype`; with `dequantize` quantized layers become plain `dtype`
    matrices (computed in float32 from the stored scales, then cast)."""
    weights = dict(checkpoint.weights)
    quantized = dict(checkpoint.quantized)
    if dequantize:
        for module, spec in checkpoint.quantized.items():
            scales = weights.pop(f"{module}.scales").astype(mx.float32)
            biases = weights.pop(f"{module}.biases").astype(mx.float32)
            weights[f"{module}.weight"] = mx.dequantize(
                weights[f"{module}.weight"], scales, biases, group_size=spec.group_size, bits=spec.bits
            ).astype(dtype)
        quantized = {}
    for name, w in weights.items():
        if mx.issubdtype(w.dtype, mx.floating) and w.dtype != dtype:
            weights[name] = w.astype(dtype)
    return Checkpoint(checkpoint.args, weights, quantized, checkpoint.source)
