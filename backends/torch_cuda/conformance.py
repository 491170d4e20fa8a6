"""The torch backend's conformance adapter: its ops behind NumPy in, NumPy out (conformance/ops_adapter.py).

Inputs become torch tensors of the dtype under test on the adapter's device; softmax statistics
and scores stay float32 (float64 at float64). The hybrid cache's group runs on a tiny random
Qwen3.5 (transformers' qwen3_5_text: gated delta-net layers 0 and 2, gated attention layers 1 and
3) in that dtype on that device, through the adapter (adapted.py, hybrid_cache.py).
"""

from __future__ import annotations

import numpy as np
import torch

import specfill.backends.torch_cuda.placement as placement  # a module reference: simulated_cuda swaps RUNTIME
from specfill.conformance.checks_hybrid_cache import TINY_QWEN3_5, HybridModel
from specfill.conformance.ops_adapter import Convert, OpsAdapter
from specfill.core.errors import BackendUnavailableError

from .cache import ModelKVCache
from .kernels import kernel_unavailable_reason
from .ops import TorchOps

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def make_adapter(
    dtype: str = "float32", use_kernels: bool | None = None, device: str | torch.device | None = None
) -> OpsAdapter:
    """The torch backend's stages at `dtype` on `device` (default: CUDA when available, else CPU).

    use_kernels True forces the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1), False
    the torch twins, None lets each dispatcher choose (kernels on CUDA).
    """
    if dtype not in DTYPES:
        raise BackendUnavailableError(f"the torch backend computes in {', '.join(DTYPES)}, not {dtype}")
    resolved = (
        torch.device(device) if device is not None else torch.device("cuda" if placement.RUNTIME.available() else "cpu")
    )
    if resolved.type == "cuda" and not placement.RUNTIME.available():
        raise BackendUnavailableError(f"device {resolved} requested but torch {torch.__version__} sees no CUDA GPU")
    if use_kernels:
        reason = kernel_unavailable_reason(resolved, DTYPES[dtype])
        if reason is not None:
            raise BackendUnavailableError(reason)
    stats = torch.float64 if dtype == "float64" else torch.float32

    def tensor(x: np.ndarray, to: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), device=resolved).to(to)

    def cache(n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, value_dim: int | None) -> ModelKVCache:
        shape = (n_layers, 1, n_kv_heads, capacity, head_dim)
        value_shape = shape[:4] + (head_dim if value_dim is None else value_dim,)  # latent attention's narrower
        return ModelKVCache(
            torch.empty(shape, dtype=DTYPES[dtype], device=resolved),
            torch.empty(value_shape, dtype=DTYPES[dtype], device=resolved),
        )

    ops = TorchOps(resolved, DTYPES[dtype], use_kernels)
    convert = Convert(
        native=lambda x: tensor(x, DTYPES[dtype]),
        stats=lambda x: tensor(x, stats),
        index=lambda x: tensor(x, torch.int64),
        numpy=ops.to_numpy,
    )
    return OpsAdapter("cuda", dtype, ops, convert, cache, lambda: tiny_hybrid(dtype, use_kernels, resolved))


def tiny_hybrid(dtype: str, use_kernels: bool | None, device: torch.device) -> HybridModel | None:
    """The tiny random Qwen3.5 through the adapter, its weights in `dtype` on `device` (seeded);
    None where this transformers has no qwen3_5_text (the group then records a skip)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.models.qwen3_5 import Qwen3_5TextConfig  # noqa: F401 - present or the skip
    except ImportError:
        return None
    from .adapted import adapt
    from .hybrid_cache import HybridKVCache

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_5_text", **TINY_QWEN3_5)
    lm = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype]).to(device).eval().requires_grad_(False)
    model = adapt(lm)

    def recurrent(cache: HybridKVCache) -> list[np.ndarray]:
        tensors = []
        for i in cache.recurrent:
            layer = cache.library.layers[i]
            for states in (layer.conv_states, layer.recurrent_states):
                tensors += [t for _, t in sorted(states.items()) if t is not None]
        return [t.detach().float().cpu().numpy() for t in tensors]

    ops = TorchOps(device, DTYPES[dtype], use_kernels)
    ids = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.int64, device=device)  # noqa: E731
    return HybridModel(ops, model, ids, recurrent, TINY_QWEN3_5["vocab_size"])
