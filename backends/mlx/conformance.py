"""The MLX backend's conformance adapter: its ops behind NumPy in, NumPy out (conformance/ops_adapter.py).

Inputs become MLX arrays of the dtype under test; statistics, scores and probabilities stay
float32, as in the stages.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from specfill.conformance.ops_adapter import Convert, OpsAdapter
from specfill.core.errors import BackendUnavailableError

from .cache import LayerKVCache, ModelKVCache
from .kernels.dispatch import choose_kernel
from .ops import MLXOps

DTYPES: dict[str, mx.Dtype] = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def make_adapter(dtype: str = "float32", use_kernels: bool | None = None) -> OpsAdapter:
    """The registry's factory: MLX stages at `dtype` (float32, float16, bfloat16), kernels forced,
    off or auto."""
    if dtype not in DTYPES:
        raise BackendUnavailableError(f"the mlx backend runs in {', '.join(DTYPES)}, not {dtype}")
    choose_kernel(use_kernels, "the conformance run")  # forcing Metal without it fails here
    ops = MLXOps(mx.default_device(), use_kernels)  # its to_numpy widens float16 / bfloat16 to float32
    convert = Convert(
        native=lambda x: mx.array(np.asarray(x, dtype=np.float32)).astype(DTYPES[dtype]),
        stats=lambda x: mx.array(np.asarray(x, dtype=np.float32)),
        index=lambda x: mx.array(np.asarray(x, dtype=np.int32)),
        numpy=ops.to_numpy,
    )
    return OpsAdapter(
        "mlx",
        dtype,
        ops,
        convert,
        # the layers size their buffers from the first write: keys and values of any widths
        lambda n_layers, n_kv_heads, head_dim, capacity, value_dim: ModelKVCache(
            [LayerKVCache(capacity) for _ in range(n_layers)]
        ),
    )
