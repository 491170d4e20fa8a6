"""MLX backend: Llama/Qwen2/Qwen3 on Apple silicon (Metal), or MLX's CPU backend elsewhere.

    model, tokenizer = load(path)              # GGUF file, HF or mlx-lm directory
    logits = model([1, 2, 3])                  # mx.array [1, T, vocab] float32

dtype=None keeps quantized layers quantized (GGUF Q4_0/Q4_1/Q8_0, mlx-lm directories) and
computes in float32 on CPU, in the checkpoint's float type on the GPU; a dtype ("float32",
"float16", "bfloat16") dequantizes every layer to it at load.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx

from specfill.core.errors import BackendUnavailableError, ConfigError

from .causal_lm import MLXCausalLM, build_model
from .generate import DEFAULT_PREFILL_STEP_SIZE
from .weights import Checkpoint, load_checkpoint, to_dtype

__all__ = ["MLXCausalLM", "load", "resolve_device", "resolve_dtype"]

_DTYPES = {"float32": mx.float32, "fp32": mx.float32, "float16": mx.float16,
           "fp16": mx.float16, "half": mx.float16, "bfloat16": mx.bfloat16, "bf16": mx.bfloat16}


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
        raise BackendUnavailableError(f"device {device!r} requested but MLX has no Metal GPU here "
                                      f"(use 'cpu')")
    return resolved


def _stored_float_dtype(checkpoint: Checkpoint) -> mx.Dtype:
    """The checkpoint's activation type: its embedding scales (quantized) or embedding table."""
    name = "model.embed_tokens"
    part = "scales" if name in checkpoint.quantized else "weight"
    return checkpoint.weights[f"{name}.{part}"].dtype


def resolve_dtype(dtype: str | mx.Dtype | None, device: mx.Device,
                  checkpoint: Checkpoint) -> tuple[mx.Dtype, bool]:
    """(activation dtype, dequantize?) for a requested dtype (None: keep quantized layers)."""
    if dtype is None:
        if device.type == mx.DeviceType.cpu:  # MLX's CPU float16/bfloat16 paths are slow
            return mx.float32, False
        return _stored_float_dtype(checkpoint), False
    resolved = dtype if isinstance(dtype, mx.Dtype) else _DTYPES.get(str(dtype).lower())
    if resolved not in (mx.float32, mx.float16, mx.bfloat16):
        raise ConfigError(f"unsupported dtype {dtype!r} (use float32, float16 or bfloat16)")
    return resolved, True


def load(path: str | Path, dtype: str | mx.Dtype | None = None,
         device: str | mx.Device | None = None,
         prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE) -> tuple[MLXCausalLM, Any]:
    """(model, tokenizer) from a GGUF file or a Hugging Face / mlx-lm directory. Missing,
    corrupt or unsupported checkpoints raise ModelLoadError."""
    from specfill.core.tokenizer import load_tokenizer

    resolved_device = resolve_device(device)
    checkpoint = load_checkpoint(path)
    compute_dtype, dequantize = resolve_dtype(dtype, resolved_device, checkpoint)
    with mx.stream(resolved_device):
        checkpoint = to_dtype(checkpoint, compute_dtype, dequantize=dequantize)
        model = build_model(checkpoint)
    quantized = bool(checkpoint.quantized)
    del checkpoint
    return (MLXCausalLM(model, device=resolved_device, quantized=quantized,
                        prefill_step_size=prefill_step_size), load_tokenizer(path))
