"""A GGUF file -> HF-named MLX arrays (quantized where MLX's affine format holds the codes
exactly), checked against gguf-py's reference dequantization at load.

The header, tensor table, names and shapes come from the backend-neutral core reader (the same
errors as the torch backend for a corrupt file); the bytes from `gguf_blocks` (exact affine
triples) or from the core reader (gguf-py's dequantize, float32) - never from `mx.load`, whose
GGUF path mis-reads Q4_K (see gguf_blocks).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

from specfill.core.errors import ModelLoadError, SpecfillWarning, quote
from specfill.core.io.gguf_file import GGUFFile, GGUFTensorInfo, tensor_array, type_name
from specfill.core.io.weights import gguf_model
from specfill.core.models import ModelArgs

from .gguf_blocks import EXACT_TYPES, GROUP, affine_triple, dequantize_triple

# Spot-check tolerance, relative to the largest |value| of each 32-wide group (scales vary by orders
# of magnitude between groups, so a row-wide bound could hide a wrong code in a small group). The
# affine triple holds the reference's own float32 scale and bias, so the two differ only by float32
# rounding of scale * q + bias (a fused multiply-add in one, two roundings in the other): ~2**-23 of
# the group's magnitude; 2**-20 leaves room for that and for nothing a wrong code could hide in
# (one code step is >= 1/255 of a group's range).
SPOT_CHECK_RTOL = 2.0**-20
SPOT_ROWS = 3  # first, middle and last row of one tensor per GGML type
FLOAT_TYPES = (0, 1, 30)  # F32, F16, BF16: floats in the file already


@dataclass
class GGUFArrays:
    """What the MLX checkpoint needs from a GGUF: HF-named arrays, the quantized modules
    (module -> bits, group 32) and, per GGML type, how many tensors were kept as float."""

    args: ModelArgs
    weights: dict[str, mx.array] = field(default_factory=dict)
    quantized_bits: dict[str, int] = field(default_factory=dict)
    float_types: Counter = field(default_factory=Counter)


def _raw(gguf_file: GGUFFile, info: GGUFTensorInfo) -> np.ndarray:
    assert gguf_file.buffer is not None  # open: gguf_model read the table from it
    return gguf_file.buffer[info.offset : info.offset + info.nbytes]


def _is_matrix_weight(name: str, info: GGUFTensorInfo) -> bool:
    """Only 2-D `.weight` tensors become quantized layers (QuantizedLinear / QuantizedEmbedding)."""
    return name.endswith(".weight") and len(info.shape) == 2 and info.shape[-1] % GROUP == 0


def read_arrays(gguf_file: GGUFFile) -> GGUFArrays:
    """Every tensor of the checked table, converted; then the spot check against gguf-py."""
    args, infos = gguf_model(gguf_file)
    out = GGUFArrays(args)
    for name, info in infos.items():
        if info.ggml_type in EXACT_TYPES and _is_matrix_weight(name, info):
            packed, scales, biases = affine_triple(_raw(gguf_file, info), info.shape, info.ggml_type)
            module = name[: -len(".weight")]
            out.weights.update(
                {name: mx.array(packed), f"{module}.scales": mx.array(scales), f"{module}.biases": mx.array(biases)}
            )
            out.quantized_bits[module] = EXACT_TYPES[info.ggml_type][1]
        else:
            out.weights[name] = mx.array(tensor_array(gguf_file, info))
            if info.ggml_type not in FLOAT_TYPES:
                out.float_types[type_name(info.ggml_type)] += 1
    spot_check(gguf_file, infos, out)
    return out


def _rows(info: GGUFTensorInfo) -> list[int]:
    n = int(np.prod(info.shape[:-1], dtype=np.int64))
    return sorted({0, n // 2, n - 1})[:SPOT_ROWS]


def _reference_rows(gguf_file: GGUFFile, info: GGUFTensorInfo, rows: list[int]) -> np.ndarray:
    """gguf-py's dequantization of the chosen rows only (a row is whole blocks)."""
    from gguf import GGMLQuantizationType, quants

    if info.ggml_type in FLOAT_TYPES:
        return tensor_array(gguf_file, info).reshape(-1, info.shape[-1])[rows].astype(np.float32)
    row_bytes = info.nbytes // int(np.prod(info.shape[:-1], dtype=np.int64))
    raw = _raw(gguf_file, info).reshape(-1, row_bytes)[rows]
    return np.asarray(quants.dequantize(raw, GGMLQuantizationType(info.ggml_type)), np.float32)


def _our_rows(out: GGUFArrays, name: str, rows: list[int]) -> np.ndarray:
    module = name[: -len(".weight")]
    index = mx.array(rows)
    if module in out.quantized_bits:
        packed, scales, biases = (np.array(out.weights[f"{module}.{p}"][index]) for p in ("weight", "scales", "biases"))
        return dequantize_triple(packed, scales, biases, out.quantized_bits[module])
    return np.array(out.weights[name].reshape(-1, out.weights[name].shape[-1])[index].astype(mx.float32))


def spot_check(gguf_file: GGUFFile, infos: dict[str, GGUFTensorInfo], out: GGUFArrays) -> None:
    """For one tensor of each GGML type in the file: a few rows as the MLX backend holds them must
    equal gguf-py's dequantization within SPOT_CHECK_RTOL, else ModelLoadError (never garbage)."""
    first_of_type: dict[int, str] = {}
    for name, info in infos.items():
        first_of_type.setdefault(info.ggml_type, name)
    for ggml_type, name in first_of_type.items():
        info = infos[name]
        rows = _rows(info)
        ref = _reference_rows(gguf_file, info, rows)
        ours = _our_rows(out, name, rows)
        err = np.abs(ours - ref).reshape(len(rows), -1, GROUP)
        bound = SPOT_CHECK_RTOL * np.abs(ref).reshape(len(rows), -1, GROUP).max(-1, keepdims=True)
        if not (err <= bound).all():
            raise ModelLoadError(
                f"{quote(gguf_file.path)}: {type_name(ggml_type)} tensor {name} read back off by "
                f"up to {float(err.max()):.3g} from gguf's dequantization; refusing to run "
                f"on wrong weights"
            )


def say_float_types(out: GGUFArrays, path: Path) -> None:
    """Said once at load: which GGML types the MLX backend holds as float (more memory than the
    file) because no MLX affine format holds their blocks exactly."""
    if out.float_types:
        kinds = ", ".join(f"{t} ({n} tensors)" for t, n in sorted(out.float_types.items()))
        warnings.warn(
            f"{path.name}: {kinds} dequantized to float with gguf (no MLX group-32 affine "
            f"format holds these blocks exactly); the other quantized tensors stay quantized",
            SpecfillWarning,
            stacklevel=3,
        )
