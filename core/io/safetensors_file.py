"""Read a .safetensors file into NumPy without torch (bfloat16 widened to float32).

safetensors' own NumPy path rejects bfloat16, the usual dtype of released checkpoints, and the
format is an 8-byte header length, a JSON header and raw little-endian data. Like the GGUF
reader, every header entry is checked before use (a JSON object of entries with a known dtype,
a shape of non-negative integers and offsets that match it) and the tensors must tile the data
region exactly, as the format requires, so a lying header is one ModelLoadError.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .. import checks
from ..errors import ModelLoadError, quote
from .gguf_file import bf16_to_float32, regular_file

_FLOAT_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}
_ITEM_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}
Entry = tuple[str, tuple[int, ...], int, int]  # dtype, shape, begin and end in the data region
MAX_HEADER = 100_000_000  # the safetensors library's own limit


def _header(path: Path) -> tuple[dict[str, Any], int, int]:
    """(the JSON header without __metadata__, data start, file size)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{quote(path)} is not a safetensors file (too short)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, MAX_HEADER):
            raise ModelLoadError(f"corrupt safetensors file {quote(path)}: header length {header_len}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, ValueError) as err:
            raise ModelLoadError(f"corrupt safetensors file {quote(path)}: bad JSON header ({err})") from None
        except RecursionError:
            raise ModelLoadError(f"corrupt safetensors file {quote(path)}: JSON header nested too deeply") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"corrupt safetensors file {quote(path)}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}  # MLX writes null when it has none
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ModelLoadError(f"corrupt safetensors file {quote(path)}: __metadata__ must map names to strings")
    return header, 8 + header_len, size


def _entry(name: str, entry: Any, path: Path) -> Entry:
    """(dtype, shape, begin, end) of one header entry, each checked."""
    try:
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        begin, end = offsets
        shape = tuple(checks.integer(d, f"tensor {name} dimension", maximum=2**62) for d in shape)
        begin = checks.integer(begin, "offset", maximum=2**62)
        end = checks.integer(end, "offset", minimum=begin, maximum=2**62)
    except (KeyError, TypeError, ValueError, ModelLoadError):
        raise ModelLoadError(f"corrupt safetensors file {quote(path)}: bad entry for {name[:64]!r}") from None
    if not isinstance(dtype, str) or dtype not in _ITEM_SIZES:
        raise ModelLoadError(f"corrupt safetensors file {quote(path)}: tensor {name} has unknown dtype {dtype!r:.20}")
    count = 1
    for dim in shape:
        count *= dim
    if end - begin != count * _ITEM_SIZES[dtype]:
        raise ModelLoadError(
            f"corrupt safetensors file {quote(path)}: tensor {name} has {end - begin} bytes "
            f"for shape {shape} of {dtype}"
        )
    return dtype, shape, begin, end


def safetensors_layout(path: str | os.PathLike[str]) -> tuple[dict[str, Entry], int]:
    """({name: (dtype, shape, begin, end)}, data start) of a checked header whose tensors tile
    the data region; read before anything (our reader or mx.load) touches the data."""
    path = regular_file(path, "safetensors file")
    header, data_start, size = _header(path)
    entries = {name: _entry(name, entry, path) for name, entry in header.items()}
    expected = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != expected:
            problem = "overlaps the tensor before it" if begin < expected else "leaves a gap before it"
            raise ModelLoadError(f"corrupt safetensors file {quote(path)}: tensor {name} {problem}")
        expected = end
    if data_start + expected != size:
        raise ModelLoadError(
            f"truncated or corrupt safetensors file {quote(path)}: its tensors need "
            f"{data_start + expected} bytes, the file has {size}"
        )
    return entries, data_start


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """{name: array}: F32 -> float32, F16 stays float16, BF16/F64 -> float32."""
    entries, data_start = safetensors_layout(path)
    for name, (dtype, *_) in entries.items():
        if dtype not in _FLOAT_DTYPES:
            raise ModelLoadError(f"tensor {name} in {quote(path)} has dtype {dtype}; expected F32, F16, F64 or BF16")
    size = data_start + max((end for *_, end in entries.values()), default=0)
    data = np.memmap(path, np.uint8, "r", offset=data_start) if size > data_start else None
    tensors = {}
    for name, (dtype, shape, begin, end) in entries.items():
        raw = np.asarray(data[begin:end] if data is not None else np.zeros(0, np.uint8))
        raw = raw.view(_FLOAT_DTYPES[dtype]).reshape(shape)
        if dtype == "BF16":
            tensors[name] = bf16_to_float32(raw)
        elif dtype == "F64":
            tensors[name] = raw.astype(np.float32)
        else:
            tensors[name] = raw.copy()
    return tensors
