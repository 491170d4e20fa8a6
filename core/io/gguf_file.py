"""A small GGUF container reader: metadata, tensor table, and dequantized tensor data.

gguf's GGUFReader builds one NumPy view per metadata element (about 3 s for a 49k-token
vocabulary); this reads the header in one pass over a memmap and bounds-checks every read, so
a truncated or corrupt file gives one clear ModelLoadError. Dequantization uses gguf.quants.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf spec): scalar struct codes; 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table. shape is row-major (NumPy / HF order, the reverse of
    ggml's ne[]); offset is absolute in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]
    buffer: np.ndarray | None = None  # np.memmap of the file; unmapped once unreferenced

    def close(self) -> None:
        self.buffer = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Cursor:
    """Sequential little-endian reads over a buffer; a read past the end means truncation."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise ModelLoadError(f"truncated or corrupt GGUF file {self.path} "
                                 f"(header needs byte {start + n}, file has {self.size})")
        self.pos += n
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        return bytes(self.buf[start:start + n]).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == 6:  # float32: the shortest decimal that rounds to it (1e-05, not 9.99e-06)
            return float(str(np.float32(self.scalar("<f"))))
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _NUMPY:
                start = self.take(count * np.dtype(_NUMPY[etype]).itemsize)
                values = np.frombuffer(self.buf, _NUMPY[etype], count, start)
                return [bool(v) for v in values] if etype == 7 else values.tolist()
            return [self.value(etype) for _ in range(count)]
        raise ModelLoadError(f"corrupt GGUF file {self.path}: unknown metadata value type {vtype}")


def _tensor_nbytes(shape: tuple[int, ...], ggml_type: int, name: str, path: Path) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelLoadError(f"tensor {name!r} in {path} has unknown GGML type id {ggml_type}") from None
    count = int(np.prod(shape, dtype=np.int64))
    if shape and shape[-1] % block:
        raise ModelLoadError(f"corrupt GGUF file {path}: tensor {name!r} row of {shape[-1]} is not "
                             f"a multiple of its block size {block}")
    return count // block * type_size


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse the header of a GGUF file (v2/v3, little-endian); tensor data stays mapped."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 4 or f.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (bad magic)")
    return _parse(np.memmap(path, np.uint8, "r"), path)


def _parse(buf: np.ndarray, path: Path) -> GGUFFile:
    cur = _Cursor(buf, path)
    cur.take(4)
    version = cur.scalar("<I")
    if version not in (2, 3):
        hint = " (big-endian files are not supported)" if version >= 1 << 16 else ""
        raise ModelLoadError(f"unsupported GGUF version {version} in {path}{hint}")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    if n_tensors > cur.size // 8 or n_kv > cur.size // 8:  # every entry takes 8+ bytes
        raise ModelLoadError(f"corrupt GGUF file {path}: header claims {n_tensors} tensors, "
                             f"{n_kv} metadata keys")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    raw_infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if n_dims > 8:
            raise ModelLoadError(f"corrupt GGUF file {path}: tensor {name!r} has {n_dims} dims")
        ne = [cur.scalar("<Q") for _ in range(n_dims)]
        raw_infos.append((name, tuple(reversed(ne)), cur.scalar("<I"), cur.scalar("<Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise ModelLoadError(f"corrupt GGUF file {path}: alignment {alignment}")
    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, ggml_type, rel in raw_infos:
        nbytes = _tensor_nbytes(shape, ggml_type, name, path)
        offset = data_start + rel
        if offset + nbytes > len(buf):
            raise ModelLoadError(f"truncated GGUF file {path}: tensor {name!r} needs bytes up to "
                                 f"{offset + nbytes}, file has {len(buf)}")
        tensors[name] = GGUFTensorInfo(name, shape, ggml_type, offset, nbytes)
    return GGUFFile(path, version, metadata, tensors, buf)


def tensor_array(gguf_file: GGUFFile, info: GGUFTensorInfo) -> np.ndarray:
    """The tensor as an owned array: F16 stays float16, everything else becomes float32."""
    from gguf import GGMLQuantizationType, quants

    if gguf_file.buffer is None:
        raise ModelLoadError(f"{gguf_file.path} is closed")
    raw = np.frombuffer(gguf_file.buffer, np.uint8, info.nbytes, info.offset)
    qtype = GGMLQuantizationType(info.ggml_type)
    if qtype == GGMLQuantizationType.F32:
        return raw.view("<f4").reshape(info.shape).copy()
    if qtype == GGMLQuantizationType.F16:
        return raw.view("<f2").reshape(info.shape).copy()
    if qtype == GGMLQuantizationType.F64:
        return raw.view("<f8").reshape(info.shape).astype(np.float32)
    if qtype == GGMLQuantizationType.BF16:
        return bf16_to_float32(raw.view("<u2")).reshape(info.shape)
    rows = raw.reshape(-1, info.nbytes // max(1, int(np.prod(info.shape[:-1], dtype=np.int64))))
    try:
        out = quants.dequantize(rows, qtype)
    except NotImplementedError:
        raise ModelLoadError(f"tensor {info.name!r} uses quantization type {qtype.name}, which "
                             f"specfill cannot dequantize") from None
    return np.asarray(out, dtype=np.float32).reshape(info.shape)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32: widen the bit pattern."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name
