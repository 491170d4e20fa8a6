"""load(): checkpoint -> CausalLM + tokenizer on the torch backend, with device and dtype resolution.

A GGUF file or Hugging Face directory of one of specfill's own families loads into specfill's model
(model.py, weights.py; GGUF tensor by tensor through lean_load.py); any other architecture the
installed transformers knows, and a (transformers model, tokenizer) pair, through adapted_loader.py.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

import specfill.backends.torch_cuda.placement as placement  # a module reference: simulated_cuda swaps RUNTIME
from specfill.core.cpu import compute_threads, has_fast_bf16
from specfill.core.driver import DEFAULT_PREFILL_STEP_SIZE, CausalLM
from specfill.core.errors import BackendUnavailableError, ConfigError, ModelLoadError
from specfill.core.io.gguf_file import read_gguf
from specfill.core.io.random_model import is_random_model, random_model_args
from specfill.core.io.tokenizer import Tokenizer, load_tokenizer
from specfill.core.io.weights import load_weights
from specfill.core.model_config import foreign_gguf_architecture, foreign_model_type
from specfill.core.models import ModelArgs

from .lean_load import is_gguf_file, load_gguf_state
from .ops import TorchOps
from .weights import build_transformer, random_transformer, transformer_from_state

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def cuda_available() -> bool:
    return placement.RUNTIME.available()


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None -> CUDA when available, else CPU. Asking for CUDA without it is an error."""
    if device is None:
        return torch.device("cuda" if placement.RUNTIME.available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown torch device {device!r} (use 'cpu', 'cuda' or 'cuda:N')") from None
    if resolved.type == "cuda" and not placement.RUNTIME.available():
        raise BackendUnavailableError(
            f"device {device!r} requested but this torch ({torch.__version__}) sees no CUDA GPU"
        )
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported torch device {device!r} (use 'cpu' or 'cuda')")
    return resolved


def cpu_fallback(device: str | None) -> str | None:
    """The default device or "cuda" asked for where torch sees no CUDA GPU: the notice that it runs on
    the CPU (the CLI then loads on "cpu"); else None."""
    if device not in (None, "cuda") or placement.RUNTIME.available():
        return None
    return "no CUDA GPU found: the cuda backend runs on the CPU"


def facts() -> dict[str, Any]:
    """CUDA, Triton and BLAS as torch sees them (core/backend.py's Backend.facts: `specfill doctor`)."""
    from .kernels.dispatch import interpreting, kernel_unavailable_reason  # the kernels: imported on first use

    cuda = placement.RUNTIME.available()
    device = torch.device("cuda" if cuda else "cpu")
    found: dict[str, Any] = {
        "installed": True,
        "cuda_available": cuda,
        "cuda_version": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "triton_interpreter": interpreting(),
    }
    blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    found["blas"] = blas.group(1) if blas else "unknown"
    if cuda:
        props = placement.RUNTIME.properties(device)
        found.update(
            gpu=props.name,
            gpu_memory_gb=round(props.total_memory / 1e9, 1),
            compute_capability="{}.{}".format(*props.capability),
        )
    found["triton_kernels_unavailable"] = kernel_unavailable_reason(device, torch.float16)
    return found


def synchronize(device: str | torch.device) -> None:
    """Wait for the work queued on a CUDA device (nothing to wait for on the CPU)."""
    if placement.on_cuda(torch.device(device)):
        placement.RUNTIME.synchronize(torch.device(device))


def kernel_matrix() -> None:
    """None: the Triton kernels have no device matrix of their own (the conformance suite checks them)."""
    return None


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None -> bfloat16 on CUDA and on a CPU with fast bf16 matmuls (AVX-512 BF16 or AMX:
    core/cpu.has_fast_bf16), float32 on any other CPU; names like "bf16" or "float16" are accepted."""
    if dtype is None:
        return torch.bfloat16 if placement.on_cuda(device) or has_fast_bf16() else torch.float32
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    else:
        resolved = _DTYPES.get(str(dtype).lower())
    if resolved not in (torch.float32, torch.float16, torch.bfloat16):
        raise ConfigError(f"unsupported dtype {dtype!r} (use float32, float16 or bfloat16)")
    return resolved


def transformers_model_type(path: str | Path) -> str | None:
    """The model_type of a directory that should load through transformers (None: specfill's own
    loader: not a directory, no readable config.json, one of specfill's own families, transformers
    not installed or not knowing the type)."""
    model_type = foreign_model_type(path)
    if model_type is None or importlib.util.find_spec("transformers") is None:
        return None
    from transformers import CONFIG_MAPPING

    return model_type if model_type in CONFIG_MAPPING else None


def transformers_gguf_architecture(path: str | Path) -> str | None:
    """general.architecture of a GGUF file (already known to be one) that is not one of specfill's
    own, when transformers is installed to read it; else None (specfill's own GGUF loader)."""
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        return foreign_gguf_architecture(read_gguf(path).metadata)
    except ModelLoadError:  # a broken header: specfill's own loader names the problem
        return None


def from_weights(
    args: ModelArgs,
    weights: Mapping[str, np.ndarray],
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
    use_kernels: bool | None = None,
) -> CausalLM:
    """A CausalLM on this backend from Hugging Face-named weights. use_kernels picks the H2O /
    scoring stages: None = Triton on CUDA and the torch twins elsewhere; True / False force one."""
    return _causal_lm(build_transformer(args, weights, dtype, device), dtype, prefill_step_size, use_kernels)


def _causal_lm(model, dtype: torch.dtype, prefill_step_size: int, use_kernels: bool | None = None) -> CausalLM:
    return CausalLM(
        model, TorchOps(model.embed_tokens.weight.device, dtype, use_kernels), prefill_step_size=prefill_step_size
    )


# Longer prefill steps on a GPU with room for them: on the H200 (8B bf16, random weights), 16,384-token
# steps gave full prefill 1.10x / 1.05x / 1.02x the TTFT of 2,048-token ones at 8K / 32K / 128K and
# SpecPrefill 1.25x / 1.05x / 1.02x, at 0.7-1.6 GB more peak memory (results/gpu/h200/2026-11-29/
# run1/ttft.md, rows *-s16k). A step's activations are held under 1/20 of the memory the weights leave,
# so a long prompt's KV cache keeps nearly all the room it had with the library's 2,048.
GPU_PREFILL_STEPS = (16384, 8192, 4096)
STEP_MEMORY_SHARE = 1 / 20


def step_activation_bytes(args: ModelArgs, element_size: int) -> int:
    """Bytes one token of a prefill step holds at the layer's peak (a bound, not a measurement): the
    MLP's gate and up products, the fused q/k/v, and four hidden-sized rows (input, norm, attention
    output, residual)."""
    qkv = (args.num_attention_heads + 2 * args.num_key_value_heads) * args.head_dim
    return (2 * args.intermediate_size + 4 * args.hidden_size + qkv) * element_size


def device_prefill_step(model: CausalLM, device: torch.device) -> int:
    """The prefill step a model on `device` takes when none is asked: the longest of GPU_PREFILL_STEPS
    whose activations (step_activation_bytes) fit STEP_MEMORY_SHARE of the GPU's memory less the
    weights; DEFAULT_PREFILL_STEP_SIZE off CUDA, or where none fits."""
    parameters = getattr(model.model, "parameters", None)
    if not placement.on_cuda(device) or parameters is None:
        return DEFAULT_PREFILL_STEP_SIZE
    tensors = list(parameters())
    weights = sum(t.numel() * t.element_size() for t in tensors)
    room = placement.RUNTIME.properties(device).total_memory - weights
    per_token = step_activation_bytes(model.args, tensors[0].element_size() if tensors else 2)
    fitting = [step for step in GPU_PREFILL_STEPS if step * per_token <= room * STEP_MEMORY_SHARE]
    return max(fitting, default=DEFAULT_PREFILL_STEP_SIZE)


def load(
    path: str | Path | tuple[Any, Any],
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    prefill_step_size: int | None = None,
) -> tuple[CausalLM, Tokenizer]:
    """(model, tokenizer), its prefill step `prefill_step_size` or, with None, the device's
    (device_prefill_step: longer on a GPU with room for it, the library's 2,048 elsewhere)."""
    model, tokenizer = _load(
        path, dtype, device, DEFAULT_PREFILL_STEP_SIZE if prefill_step_size is None else prefill_step_size
    )
    if prefill_step_size is None:
        model.prefill_step_size = device_prefill_step(model, resolve_device(device))
    return model, tokenizer


def _load(
    path: str | Path | tuple[Any, Any],
    dtype: str | torch.dtype | None,
    device: str | torch.device | None,
    prefill_step_size: int,
) -> tuple[CausalLM, Tokenizer]:
    """(model, tokenizer) from a GGUF file or a Hugging Face directory (config.json +
    safetensors). Missing, corrupt or unsupported checkpoints raise ModelLoadError. A directory
    of an architecture specfill has no model file for runs transformers' own model with the
    attention adapted (adapted_loader.py), as does a (transformers model, tokenizer) pair.

    A GGUF file is read tensor by tensor straight into `dtype` on `device` (lean_load.py: host
    memory peaks near the loaded weights' size); directories and random:SHAPE go through the
    shared NumPy loader, except random:SHAPE on a GPU, drawn there (weights.random_transformer)."""
    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    threads = compute_threads()  # a CLI command's: --threads, else this machine's physical cores
    if threads is not None and not placement.on_cuda(resolved_device):
        torch.set_num_threads(threads)
    if isinstance(path, tuple):
        from .adapted_loader import load_pair  # another library's model: its loader is imported only then

        return load_pair(path, resolved_dtype, resolved_device, prefill_step_size)
    gguf = is_gguf_file(path)
    architecture = transformers_model_type(path)
    if architecture is None and gguf:
        architecture = transformers_gguf_architecture(path)
    if architecture is not None:
        from .adapted_loader import load_adapted

        return load_adapted(path, resolved_dtype, resolved_device, prefill_step_size, architecture=architecture)
    if gguf:
        args, state = load_gguf_state(path, resolved_dtype, resolved_device)
        model = _causal_lm(transformer_from_state(args, state, resolved_device), resolved_dtype, prefill_step_size)
        del state
    elif is_random_model(path) and placement.on_cuda(resolved_device):  # drawn on the GPU, no host copy
        args = random_model_args(str(path))
        model = _causal_lm(random_transformer(args, resolved_dtype, resolved_device), resolved_dtype, prefill_step_size)
    else:
        args, weights = load_weights(path)
        model = from_weights(
            args, weights, dtype=resolved_dtype, device=resolved_device, prefill_step_size=prefill_step_size
        )
        del weights
    return model, load_tokenizer(path)
