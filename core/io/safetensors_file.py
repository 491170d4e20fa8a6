"""Read a .safetensors file into NumPy without torch (bfloat16 widened to float32).

safetensors' own NumPy path rejects bfloat16, the usual dtype of released checkpoints, and the
format is an 8-byte header length, a JSON header and raw little-endian data.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from .gguf_file import bf16_to_float32

_FLOAT_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """{name: array}: F32 -> float32, F16 stays float16, BF16/F64 -> float32."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{path} is not a safetensors file (too short)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100_000_000):
            raise ModelLoadError(f"corrupt safetensors file {path}: header length {header_len}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ModelLoadError(f"corrupt safetensors file {path}: bad JSON header ({err})") from None
    header.pop("__metadata__", None)
    data = np.memmap(path, np.uint8, "r", offset=8 + header_len) if size > 8 + header_len else None
    tensors = {}
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(f"corrupt safetensors file {path}: bad entry for {name}") from None
        if dtype not in _FLOAT_DTYPES:
            raise ModelLoadError(f"tensor {name} in {path} has dtype {dtype}; expected F32, F16 "
                                 f"or BF16")
        itemsize = np.dtype(_FLOAT_DTYPES[dtype]).itemsize
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * itemsize or data is None or end > data.shape[0]:
            raise ModelLoadError(f"truncated or corrupt safetensors file {path}: tensor {name}")
        raw = np.asarray(data[begin:end]).view(_FLOAT_DTYPES[dtype]).reshape(shape)
        if dtype == "BF16":
            tensors[name] = bf16_to_float32(raw)
        elif dtype == "F64":
            tensors[name] = raw.astype(np.float32)
        else:
            tensors[name] = raw.copy()
    return tensors
