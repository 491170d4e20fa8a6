"""The GGUF tensor table, checked before any tensor is read (by our reader and before mx.load).

A file whose table lies gives garbage weights or reads out of bounds rather than an error: a
tensor's type id changed to another valid type changes its byte size, so it overlaps its
neighbour or leaves a gap; a zero dimension divides by zero downstream. So every entry must have
1..4 dimensions, each > 0, a known GGML type whose block divides its row, a unique name under
llama.cpp's 64-byte limit and an aligned offset; and the tensors, in offset order, must tile
the data region exactly (each starts where the previous one ends, rounded up to the alignment,
and the file ends after the last one's padding).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import ModelLoadError, quote

GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # llama.cpp refuses names of 64 bytes or more
MAX_TENSORS = 1 << 16  # the largest released models hold a few thousand

# (name, shape in NumPy order, ggml type id, offset relative to the data region)
RawEntry = tuple[str, tuple[int, ...], int, int]
Fail = Callable[[str], ModelLoadError]  # problem -> the error naming the file


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table. shape is row-major (NumPy / HF order, the reverse of
    ggml's ne[]); offset is absolute in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


def read_entry(buf: bytes, pos: int, size: int, fail: Fail) -> tuple[RawEntry, int] | None:
    """One tensor-table entry at `pos` -> (entry, next pos); None when the file ends first.
    The entry is name (u64 length + bytes), n_dims (u32), ne[n_dims] (u64), type (u32),
    offset (u64)."""
    if pos + 8 > size:
        return None
    (n,) = struct.unpack_from("<Q", buf, pos)
    if pos + 8 + n + 4 > size:
        return None
    name = buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace")
    pos += 8 + n
    (n_dims,) = struct.unpack_from("<I", buf, pos)
    if not 1 <= n_dims <= GGML_MAX_DIMS:
        raise fail(f"tensor {name[:64]!r} has {n_dims} dimensions (1 to {GGML_MAX_DIMS})")
    end = pos + 4 + 8 * n_dims + 12
    if end > size:
        return None
    *ne, ggml_type, offset = struct.unpack_from(f"<{n_dims}QIQ", buf, pos + 4)
    return (name, tuple(reversed(ne)), ggml_type, offset), end


def tensor_table(
    entries: Sequence[RawEntry], data_start: int, file_size: int, alignment: int, path: Path, fail: Fail
) -> dict[str, GGUFTensorInfo]:
    """{name: info} with absolute offsets, or ModelLoadError naming the first bad entry."""
    from gguf import GGML_QUANT_SIZES

    sizes = {int(t): v for t, v in GGML_QUANT_SIZES.items()}
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, shape, ggml_type, rel in entries:
        if name in tensors:
            raise fail(f"tensor name {name!r} appears twice")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise fail(f"tensor name {name[:40]!r}... is {len(name.encode())} bytes (at most {GGML_MAX_NAME - 1})")
        if 0 in shape:
            raise fail(f"tensor {name!r} has a zero dimension {shape}")
        if ggml_type not in sizes:
            raise ModelLoadError(f"tensor {name!r} in {quote(path)} has unknown GGML type id {ggml_type}")
        block, type_size = sizes[ggml_type]
        if shape[-1] % block:
            raise fail(f"tensor {name!r} row of {shape[-1]} is not a multiple of its block size {block}")
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count // block * type_size
        if rel % alignment:
            raise fail(f"tensor {name!r} offset {rel} is not a multiple of the alignment {alignment}")
        if data_start + rel + nbytes > file_size:
            raise ModelLoadError(
                f"truncated GGUF file {quote(path)}: tensor {name!r} needs bytes up to "
                f"{data_start + rel + nbytes}, file has {file_size}"
            )
        tensors[name] = GGUFTensorInfo(name, shape, ggml_type, data_start + rel, nbytes)
    _check_tiling(list(tensors.values()), data_start, file_size, alignment, fail)
    return tensors


def _check_tiling(infos: list[GGUFTensorInfo], data_start: int, file_size: int, alignment: int, fail: Fail) -> None:
    """In offset order each tensor starts where the previous one's padded end is; the file ends
    within the last one's padding."""
    if not infos:
        return
    expected, previous = data_start, None
    for info in sorted(infos, key=lambda i: i.offset):
        if info.offset < expected:
            raise fail(f"tensor {info.name!r} overlaps tensor {previous!r}")
        if info.offset > expected:
            raise fail(
                f"{info.offset - expected} unused bytes before tensor {info.name!r} (tensors must fill the data region)"
            )
        end = info.offset + info.nbytes
        expected, previous = end + (-end % alignment), info.name
    if not end <= file_size <= expected:
        raise fail(
            f"{file_size - expected} bytes after the last tensor {previous!r} (tensors must fill the data region)"
        )
