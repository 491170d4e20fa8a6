"""A small GGUF container reader: metadata, tensor table, and dequantized tensor data.

gguf's GGUFReader builds one NumPy view per metadata element (about 3 s for a 49k-token
vocabulary); this reads the header in one pass over an mmap and checks every read before using
it, so a truncated, corrupt or hostile file gives one clear ModelLoadError in time linear in the
file (each count is bounded by the bytes left before it is looped over; arrays do not nest, as
in llama.cpp). The tensor table is checked by gguf_tensors; dequantization uses gguf.quants.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError, quote
from .gguf_tensors import MAX_TENSORS, GGUFTensorInfo, read_entry, tensor_table

__all__ = [
    "DEFAULT_ALIGNMENT",
    "FLOAT64",
    "GGUF_MAGIC",
    "GGUFFile",
    "GGUFTensorInfo",
    "bf16_to_float32",
    "existing_path",
    "read_gguf",
    "regular_file",
    "tensor_array",
    "type_name",
]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata key count

# GGUF metadata value types (gguf spec): scalar struct codes; 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9
FLOAT64 = 12
_U64 = struct.Struct("<Q")
MAX_KEYS = 1 << 16  # released models carry a few dozen


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]
    buffer: np.ndarray | None = None  # uint8 view of the mapped file; unmapped once unreferenced
    value_types: frozenset[int] = frozenset()  # metadata value types present (array element types too)

    def close(self) -> None:
        self.buffer = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def regular_file(path: str | os.PathLike[str], what: str = "model file") -> Path:
    """The path, if it names a regular file: a FIFO, device or socket would block or stream
    forever in open() or read(), a directory is not a file."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise ModelLoadError(f"{what} {str(path)[:200]} cannot be read: {err.strerror}") from None
    except ValueError:  # an embedded NUL byte
        raise ModelLoadError(f"{what} {str(path)[:200]!r} is not a valid path") from None
    if not stat.S_ISREG(mode):
        raise ModelLoadError(f"{what} {quote(path)} is not a regular file")
    return path


def existing_path(path: str | os.PathLike[str]) -> Path:
    """The path of a model file or directory that exists; a missing path, a name too long, a
    link loop or a NUL byte is one ModelLoadError (pathlib's exists() raises some of these)."""
    path = Path(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"model path does not exist: {quote(path)}") from None
    except OSError as err:
        raise ModelLoadError(f"model path {str(path)[:200]} cannot be read: {err.strerror}") from None
    except ValueError:  # an embedded NUL byte
        raise ModelLoadError(f"model path {str(path)[:200]!r} is not a valid path") from None
    return path


class _Cursor:
    """Sequential little-endian reads over the mapped file; a read past the end is truncation."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)
        self.types: set[int] = set()

    def fail(self, problem: str) -> ModelLoadError:
        return ModelLoadError(f"corrupt GGUF file {quote(self.path)}: {problem}")

    def take(self, n: int) -> int:
        start = self.pos
        if start + n > self.size:
            raise ModelLoadError(
                f"truncated or corrupt GGUF file {quote(self.path)} "
                f"(header needs byte {start + n}, file has {self.size})"
            )
        self.pos += n
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        return self.buf[start : start + n].decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str) -> Any:
        self.types.add(vtype)
        if vtype == 6:  # float32: the shortest decimal that rounds to it (1e-05, not 9.99e-06)
            return float(str(np.float32(self.scalar("<f"))))
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(key)
        raise self.fail(f"metadata key {key!r} has unknown value type {vtype}")

    def array(self, key: str) -> list[Any]:
        etype, count = self.scalar("<I"), self.scalar("<Q")
        self.types.add(etype)
        if etype in _NUMPY:
            start = self.take(count * np.dtype(_NUMPY[etype]).itemsize)
            values = np.frombuffer(self.buf, _NUMPY[etype], count, start)
            return values.astype(bool).tolist() if etype == 7 else values.tolist()
        if etype != _STRING:
            raise self.fail(
                f"metadata key {key!r} is an array of type {etype} (arrays hold numbers or "
                f"strings; nested arrays are not supported, as in llama.cpp)"
            )
        if count > (self.size - self.pos) // 8:  # every string takes 8 bytes or more
            raise ModelLoadError(
                f"truncated or corrupt GGUF file {quote(self.path)}: metadata key {key!r} claims "
                f"{count} strings, more than the {self.size - self.pos} bytes left hold"
            )
        return self.strings(count)

    def strings(self, count: int) -> list[str]:
        """count length-prefixed strings: one tight loop, the bulk of a vocabulary's header."""
        buf, pos, size, unpack, out = self.buf, self.pos, self.size, _U64.unpack_from, []
        for _ in range(count):
            if pos + 8 > size:
                break
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                break
            out.append(buf[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        if len(out) < count:
            self.take(size + 1 - pos)  # raises the truncation error
        return out


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse the header of a GGUF file (v2/v3, little-endian); tensor data stays mapped."""
    path = regular_file(path, "GGUF file")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{quote(path)} is not a GGUF file (bad magic)")
        if os.fstat(f.fileno()).st_size < _HEADER.size:
            raise ModelLoadError(f"truncated GGUF file {quote(path)} (shorter than its {_HEADER.size}-byte header)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _parse(buf, path)


def _parse(buf: mmap.mmap, path: Path) -> GGUFFile:
    cur = _Cursor(buf, path)
    _, version, n_tensors, n_kv = _HEADER.unpack_from(buf, cur.take(_HEADER.size))
    if version not in (2, 3):
        hint = " (big-endian files are not supported)" if version >= 1 << 16 else ""
        raise ModelLoadError(f"unsupported GGUF version {version} in {quote(path)}{hint}")
    # a key/value takes 13+ bytes (key length, type, a value byte), a tensor entry 32+
    if n_kv * 13 + n_tensors * 32 > cur.size or n_kv > MAX_KEYS or n_tensors > MAX_TENSORS:
        raise ModelLoadError(
            f"truncated or corrupt GGUF file {quote(path)}: header claims {n_tensors} tensors and "
            f"{n_kv} metadata keys (at most {MAX_TENSORS} and {MAX_KEYS}, and no more than "
            f"{cur.size} bytes hold)"
        )
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        if key in metadata:
            raise cur.fail(f"metadata key {key!r} appears twice")
        metadata[key] = cur.value(cur.scalar("<I"), key)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment must be a power of two, got {alignment!r:.40}")
    entries = []
    for _ in range(n_tensors):
        entry = read_entry(buf, cur.pos, cur.size, cur.fail)
        if entry is None:
            cur.take(cur.size + 1 - cur.pos)  # raises the truncation error
        entries.append(entry[0])
        cur.pos = entry[1]
    data_start = cur.pos + (-cur.pos % alignment)
    tensors = tensor_table(entries, data_start, cur.size, alignment, path, cur.fail)
    return GGUFFile(path, version, metadata, tensors, np.frombuffer(buf, np.uint8), frozenset(cur.types))


def tensor_array(gguf_file: GGUFFile, info: GGUFTensorInfo) -> np.ndarray:
    """The tensor as an owned array: F16 stays float16, everything else becomes float32."""
    from gguf import GGMLQuantizationType, quants

    if gguf_file.buffer is None:
        raise ModelLoadError(f"{quote(gguf_file.path)} is closed")
    raw = gguf_file.buffer[info.offset : info.offset + info.nbytes]
    qtype = GGMLQuantizationType(info.ggml_type)
    if qtype == GGMLQuantizationType.F32:
        return raw.view("<f4").reshape(info.shape).copy()
    if qtype == GGMLQuantizationType.F16:
        return raw.view("<f2").reshape(info.shape).copy()
    if qtype == GGMLQuantizationType.F64:
        return raw.view("<f8").reshape(info.shape).astype(np.float32)
    if qtype == GGMLQuantizationType.BF16:
        return bf16_to_float32(raw.view("<u2")).reshape(info.shape)
    rows = raw.reshape(-1, info.nbytes // int(np.prod(info.shape[:-1], dtype=np.int64)))
    try:
        out = quants.dequantize(rows, qtype)
    except NotImplementedError:
        raise ModelLoadError(
            f"tensor {info.name!r} uses quantization type {qtype.name}, which specfill cannot dequantize"
        ) from None
    return np.asarray(out, dtype=np.float32).reshape(info.shape)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32: widen the bit pattern."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name
