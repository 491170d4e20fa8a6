"""Lean loading: a GGUF file's tensors straight into the target dtype and device, block by block.

The shared loader (core.io.weights.load_weights) dequantizes every tensor to float32 NumPy before
the device copy: a 1.5B model held ~6 GB of host memory for a 3 GB bf16 model. Here each tensor
is allocated once in its final dtype on its final device, and filled from blocks of rows read
with os.pread (no file pages stay mapped, so they never count in the process RSS) and
dequantized (gguf.quants) to float32 a block at a time (BLOCK_ELEMENTS floats, 32 MB). Peak host
memory is then the loaded weights (on CPU) plus one block. Q/K/V are written into their fused
matrix directly; llama's Q/K row permutation is undone in place per tensor.
Names, shapes and checks are core.io.weights' (gguf_model: one list of what a model holds).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from specfill.core.errors import ModelLoadError
from specfill.core.io.gguf_file import GGUFTensorInfo, bf16_to_float32, read_gguf, type_name
from specfill.core.io.weights import gguf_model, gguf_qk_heads, unpermute_qk
from specfill.core.io.weights import is_gguf_file as shared_is_gguf_file
from specfill.core.models import ModelArgs

from .weights import module_name

BLOCK_ELEMENTS = 1 << 23  # floats dequantized at once: 32 MB of float32
_PLAIN = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """True for an existing regular file that starts with the GGUF magic (the lean path's input).
    Anything else (a directory, a missing path, random:SHAPE, a FIFO that would block in open())
    goes to the shared loader, whose checks give the one-line error."""
    try:
        return shared_is_gguf_file(Path(path))
    except (ModelLoadError, OSError, ValueError):
        return False


def _decode(raw: np.ndarray, ggml_type: int, name: str) -> np.ndarray:
    """raw [rows, bytes per row] uint8 -> float32 (float16 kept for F16) [rows, row length]."""
    from gguf import GGMLQuantizationType, quants

    kind = type_name(ggml_type)
    if kind in _PLAIN:
        return raw.view(_PLAIN[kind])
    if kind == "BF16":
        return bf16_to_float32(raw.view("<u2"))
    try:
        return quants.dequantize(raw, GGMLQuantizationType(ggml_type))
    except NotImplementedError:
        raise ModelLoadError(
            f"tensor {name!r} uses quantization type {kind}, which specfill cannot dequantize"
        ) from None


def read_tensor_into(fd: int, info: GGUFTensorInfo, name: str, out: torch.Tensor, source: Path) -> None:
    """Fill `out` (shape info.shape, any float dtype and device) from the GGUF tensor `info`,
    BLOCK_ELEMENTS at a time. NaN or Inf in the weights is one ModelLoadError."""
    rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
    row_length, row_bytes = info.shape[-1], info.nbytes // rows
    flat = out.view(rows, row_length)
    step = max(1, BLOCK_ELEMENTS // row_length)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        raw = np.empty((stop - start, row_bytes), np.uint8)  # writable, so torch may wrap it
        if os.preadv(fd, [raw], info.offset + start * row_bytes) != raw.nbytes:
            raise ModelLoadError(f"truncated GGUF file {source}: tensor {name!r}")
        block = _decode(raw, info.ggml_type, name)
        if not np.isfinite(block).all():
            raise ModelLoadError(f"tensor {name} in {source} holds NaN or Inf values")
        flat[start:stop].copy_(torch.from_numpy(block))  # casts while copying: no temporary


def _targets(
    args: ModelArgs, infos: dict[str, GGUFTensorInfo], dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(state dict of empty tensors in the Transformer's names, {HF name: the view it fills}).

    q/k/v weights and biases are row slices of one fused qkv_proj tensor; tied embeddings share."""
    state: dict[str, torch.Tensor] = {}
    views: dict[str, torch.Tensor] = {}

    def put(key: str, names: list[str]) -> None:
        shapes = [infos[n].shape for n in names]
        state[key] = torch.empty((sum(s[0] for s in shapes), *shapes[0][1:]), dtype=dtype, device=device)
        start = 0
        for name, shape in zip(names, shapes):
            views[name] = state[key][start : start + shape[0]]
            start += shape[0]

    for name in infos:
        if (ours := module_name(name)) is not None:
            put(ours, [name])
    if args.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    for i in range(args.num_hidden_layers):
        for kind in ("weight", "bias"):
            qkv = [f"model.layers.{i}.self_attn.{w}_proj.{kind}" for w in "qkv"]
            if qkv[0] in infos:
                put(f"layers.{i}.self_attn.qkv_proj.{kind}", qkv)
    unplaced = sorted(set(infos) - set(views))
    if unplaced:  # check_tensors admits only what the model takes: this is a bug, not bad input
        raise AssertionError(f"tensors without a place in the model: {unplaced[:3]}")
    return state, views


def load_gguf_state(
    path: str | os.PathLike[str], dtype: torch.dtype, device: torch.device
) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, the Transformer's state dict in `dtype` on `device`) from a GGUF file, one
    tensor at a time; the same names, layout and checks as core.io.weights.load_weights."""
    path = Path(path)
    with read_gguf(path) as gguf_file:
        args, infos = gguf_model(gguf_file)
    state, views = _targets(args, infos, dtype, device)
    fd = os.open(path, os.O_RDONLY)
    try:
        for name, info in infos.items():
            read_tensor_into(fd, info, name, views[name], path)
            if (heads := gguf_qk_heads(args, name)) is not None:
                views[name].copy_(unpermute_qk(views[name].clone(), heads))
    finally:
        os.close(fd)
    return args, state
