"""PyTorch backend: Llama/Mistral/Qwen2/Qwen3/Gemma 3 on CUDA (Jetson, desktop GPUs) with a CPU fallback.

    model, tokenizer = load(path)                       # GGUF file or Hugging Face directory
    logits = model([1, 2, 3])                           # [1, T, vocab] float32

The model runtime:
  loader.py       load(), from_weights(): device and dtype resolution, checkpoint -> model + tokenizer;
                  the package's BACKEND (core/backend.py) calls it
  weights.py      Hugging Face-named weights -> the model; lean_load.py: a GGUF file tensor by tensor
  model.py        the Llama/Mistral/Qwen2/Qwen3/Gemma 3 modules; rope.py; attention.py; cache.py (KV cache)
  ops.py          the ops protocol of core/ops.py on torch tensors; placement.py: the CUDA runtime seam
  adapter.py, adapted.py, adapted_probe.py, adapted_loader.py: transformers' models with the attention adapted
  kernels/, method_ops.py, conformance.py: the sparse prefill stages (Triton kernels and torch twins)

Importing this package does not import torch: the names below come from loader.py when first read
(`load` says what is missing, as the MLX backend's does).
"""

from __future__ import annotations

import importlib
from typing import Any

from specfill.core.backend import Backend

__all__ = ["CausalLM", "TorchOps", "cuda_available", "from_weights", "load", "resolve_device", "resolve_dtype"]

# What the API, the CLI and the server ask of this backend (core/backend.py); loader.py implements it.
BACKEND = Backend(name="cuda", extra="cuda", loader_module="specfill.backends.torch_cuda.loader")
load = BACKEND.load


def __getattr__(name: str) -> Any:
    """The loader's public names (and torch with them) on first use."""
    if name in __all__:
        return getattr(importlib.import_module(BACKEND.loader_module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
