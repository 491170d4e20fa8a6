"""load(): checkpoint -> CausalLM + tokenizer, with device and dtype resolution.

dtype=None keeps quantized layers quantized (GGUF Q4_0/Q4_1/Q8_0, mlx-lm directories) and
computes in float32 on CPU, in the checkpoint's float type on the GPU; a dtype ("float32",
"float16", "bfloat16") dequantizes every layer to it at load.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specfill.core.driver import DEFAULT_PREFILL_STEP_SIZE, CausalLM
from specfill.core.errors import BackendUnavailableError, ConfigError, ModelLoadError
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.model_config import foreign_model_type

from .model import Model
from .ops import MLXOps
from .weights import Checkpoint, load_checkpoint, to_dtype

_DTYPES = {
    "float32": mx.float32,
    "fp32": mx.float32,
    "float16": mx.float16,
    "fp16": mx.float16,
    "half": mx.float16,
    "bfloat16": mx.bfloat16,
    "bf16": mx.bfloat16,
}


def resolve_device(device: str | mx.Device | None) -> mx.Device:
    """None -> MLX's default (the GPU where Metal is available); "gpu"/"metal" or "cpu"."""
    if device is None:
        return mx.default_device()
    if isinstance(device, mx.Device):
        resolved = device
    elif str(device).lower() in ("gpu", "metal", "mps"):
        resolved = mx.Device(mx.gpu)
    elif str(device).lower() == "cpu":
        resolved = mx.Device(mx.cpu)
    else:
        raise ConfigError(f"unknown MLX device {device!r} (use 'cpu' or 'gpu')")
    if resolved.type == mx.DeviceType.gpu and not mx.metal.is_available():
        raise BackendUnavailableError(f"device {device!r} requested but MLX has no Metal GPU here (use 'cpu')")
    return resolved


def _stored_float_dtype(checkpoint: Checkpoint) -> mx.Dtype:
    """The checkpoint's activation type: the file's own float type where known (GGUF: float16), else its
    embedding scales (quantized) or embedding table."""
    if checkpoint.float_dtype is not None:
        return checkpoint.float_dtype
    name = "model.embed_tokens"
    part = "scales" if name in checkpoint.quantized else "weight"
    return checkpoint.weights[f"{name}.{part}"].dtype


def cpu_fallback(device: str | None) -> str | None:
    """None: MLX runs on its own default device (the GPU where Metal is, else the CPU) without a notice."""
    return None


def facts() -> dict[str, Any]:
    """Metal, the device and the BLAS MLX's CPU backend uses (core/backend.py's Backend.facts)."""
    metal = bool(mx.metal.is_available())
    preload = os.environ.get("LD_PRELOAD", "")
    return {
        "installed": True,
        "metal_available": metal,
        "device_info": {k: str(v) for k, v in mx.device_info().items()},
        "cpu_blas": "Accelerate"
        if metal
        else "OpenBLAS (LD_PRELOAD)"
        if "openblas" in preload.lower()
        else "MLX's bundled reference BLAS (slow; see docs/results.md, OpenBLAS)",
    }


def synchronize(device: str | mx.Device | None = None) -> None:
    """Wait for the work queued on MLX's streams (one queue: `device` changes nothing)."""
    mx.synchronize()


def kernel_matrix() -> dict[str, Any]:
    """Every Metal kernel cell against its MLX-ops twin on this Mac's GPU (kernels/matrix.py)."""
    from .kernels.matrix import run_metal_matrix  # the kernels: imported on first use

    return run_metal_matrix()


def launched_group() -> Any:
    """The mx.distributed group mlx.launch (or mpirun) started this process in when it has more than one
    rank, else None (core/backend.py's Backend.launched_group: the CLI's generate and serve pass it to load)."""
    if not mx.distributed.is_available():
        return None
    group = mx.distributed.init()  # a group of one where no launcher started this process
    return group if group.size() > 1 else None


def resolve_dtype(dtype: str | mx.Dtype | None, device: mx.Device | None = None) -> mx.Dtype | None:
    """A requested dtype: None (keep quantized layers; the compute dtype then follows the checkpoint
    and the device, activation_dtype) or float32 / float16 / bfloat16, the same on every device."""
    if dtype is None:
        return None
    if isinstance(dtype, mx.Dtype):
        resolved = dtype
    else:
        resolved = _DTYPES.get(str(dtype).lower())
    if resolved is None or resolved not in (mx.float32, mx.float16, mx.bfloat16):
        raise ConfigError(f"unsupported dtype {dtype!r} (use float32, float16 or bfloat16)")
    return resolved


def activation_dtype(dtype: mx.Dtype | None, device: mx.Device, checkpoint: Checkpoint) -> mx.Dtype:
    """The requested dtype, else float32 on CPU (MLX's CPU float16/bfloat16 paths are slow) and
    the checkpoint's own float type on the GPU."""
    if dtype is not None:
        return dtype
    return mx.float32 if device.type == mx.DeviceType.cpu else _stored_float_dtype(checkpoint)


def build_model(checkpoint: Checkpoint) -> Model:
    """The model with the checkpoint's arrays; its quantized layers become QuantizedLinear /
    QuantizedEmbedding (quantized matmul). Parameters are evaluated before returning."""
    model = Model(checkpoint.args)
    specs = checkpoint.quantized
    if specs:
        nn.quantize(
            model,
            class_predicate=lambda path, _: (
                {"group_size": specs[path].group_size, "bits": specs[path].bits} if path in specs else False
            ),
        )
    try:
        model.load_weights(list(checkpoint.weights.items()), strict=True)
    except ValueError as err:  # a shape or name mismatch the tensor check did not catch
        raise ModelLoadError(f"{checkpoint.source}: {err}") from None
    mx.eval(model.parameters())
    return model


def mlx_lm_model_type(path: str | Path) -> str | None:
    """The model_type of a directory that should load through mlx-lm (None: specfill's own loader:
    not a directory, no readable config.json, one of specfill's own families, or a type mlx-lm
    has no model file for)."""
    model_type = foreign_model_type(path)
    if model_type is None or importlib.util.find_spec(f"mlx_lm.models.{model_type}") is None:
        return None
    return model_type


def load(
    path: str | Path | tuple[Any, Any],
    dtype: str | mx.Dtype | None = None,
    device: str | mx.Device | None = None,
    prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
    *,
    group: Any = None,
    pipeline: bool = False,
) -> tuple[CausalLM, Any]:
    """(model, tokenizer) from a GGUF file or a Hugging Face / mlx-lm directory, or a (model,
    tokenizer) pair from `mlx_lm.load`. Directories of architectures specfill has no model file
    for, and such pairs, run mlx-lm's own model with the attention adapted (adapted_loader.py).
    group: an mx.distributed group of size > 1 shards the mlx-lm model over it with mlx-lm's own
    tensor (or, pipeline=True, pipeline) parallel code (distributed.py); size 1 or None: one process.
    Missing, corrupt or unsupported checkpoints raise ModelLoadError."""
    resolved_device = resolve_device(device)
    requested_dtype = resolve_dtype(dtype)
    if group is not None and group.size() > 1:
        from .distributed import load_distributed  # sharded over the group by mlx-lm's own code

        if not isinstance(path, tuple) and Path(path).suffix == ".gguf":
            raise ConfigError(
                "a distributed group shards mlx-lm models: pass an mlx-lm / Hugging Face directory, not a GGUF file"
            )
        return load_distributed(
            path, requested_dtype, resolved_device, prefill_step_size, group=group, pipeline=pipeline
        )
    architecture = None if isinstance(path, tuple) else mlx_lm_model_type(path)
    if isinstance(path, tuple) or architecture is not None:
        from .adapted_loader import load_adapted  # another library's model: its loader is imported only then

        return load_adapted(path, requested_dtype, resolved_device, prefill_step_size, architecture=architecture)
    checkpoint = load_checkpoint(path)
    compute_dtype = activation_dtype(requested_dtype, resolved_device, checkpoint)
    with mx.stream(resolved_device):
        checkpoint = to_dtype(checkpoint, compute_dtype, dequantize=requested_dtype is not None)
        model = build_model(checkpoint)
    quantized = bool(checkpoint.quantized)
    del checkpoint
    ops = MLXOps(resolved_device, quantized=quantized)
    return CausalLM(model, ops, prefill_step_size=prefill_step_size), load_tokenizer(path)
