"""The MLX backend's conformance adapter: its ops behind NumPy in, NumPy out (conformance/ops_adapter.py).

Inputs become MLX arrays of the dtype under test; statistics, scores and probabilities stay
float32, as in the stages. The hybrid cache's group runs on a tiny random Qwen3.5 (mlx-lm's
qwen3_5: gated delta-net layers 0 and 2, gated attention layers 1 and 3) in that dtype.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from specfill.conformance.checks_hybrid_cache import TINY_QWEN3_5 as TINY_SIZES
from specfill.conformance.checks_hybrid_cache import HybridModel
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
        lambda: tiny_hybrid(dtype, use_kernels),
    )


# mlx-lm's qwen3_5 at the group's sizes (its model type and RoPE base are mlx-lm's to be told)
TINY_QWEN3_5 = dict(TINY_SIZES, model_type="qwen3_5", rope_theta=10000.0)


def tiny_hybrid(dtype: str, use_kernels: bool | None) -> HybridModel:
    """The tiny random Qwen3.5 through the adapter, its weights in `dtype` (seeded)."""
    from mlx_lm.models import qwen3_5

    from .adapted import AdaptedOps, adapt
    from .hybrid_cache import HybridKVCache, _state_of

    mx.random.seed(0)
    lm = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(TINY_QWEN3_5))
    lm.set_dtype(DTYPES[dtype])
    model = adapt(lm)

    def recurrent(cache: HybridKVCache) -> list[np.ndarray]:
        arrays = [a for i in cache.recurrent for a in _state_of(cache.per_layer[i]).cache if a is not None]
        return [np.array(a.astype(mx.float32)) for a in arrays]

    ops = AdaptedOps(mx.default_device(), use_kernels)
    return HybridModel(ops, model, lambda ids: mx.array(ids), recurrent, TINY_QWEN3_5["vocab_size"])
