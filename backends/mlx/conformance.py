"""The conformance adapter: the MLX stages behind NumPy in, NumPy out.

Inputs arrive as float64 NumPy arrays already rounded to the dtype under test; they become MLX
arrays of that dtype (statistics, scores and probabilities stay float32, as in the stages) and
results go back as NumPy arrays. `attention_layer` runs the one walk of core/methods/h2o.py
over this backend's ops (backends/mlx/ops.py).
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from specfill.core import stages
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import BackendUnavailableError
from specfill.core.methods.h2o import h2o_attention_layer
from specfill.core.reference.specprefill import select_tokens

from .kernels.dispatch import should_use_kernel
from .ops import MLXOps

DTYPES: dict[str, mx.Dtype] = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def _np(x: mx.array) -> np.ndarray:
    """MLX -> NumPy (bfloat16 has no NumPy dtype: widen to float32 first)."""
    return np.array(x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x)


def _np_state(state: stages.AttentionState) -> stages.AttentionState:
    return stages.AttentionState(_np(state.m), _np(state.l), _np(state.o))


def _np_memory(memory: stages.MemorySet) -> stages.MemorySet:
    return stages.MemorySet(np.array(memory.indices).astype(np.int64), memory.chunk_index)


def _mx_memory(memory: stages.MemorySet) -> stages.MemorySet:
    return stages.MemorySet(mx.array(np.asarray(memory.indices, dtype=np.int32)), memory.chunk_index)


class MLXAdapter:
    """Both methods' MLX stages at one compute dtype, with kernels forced, off or auto."""

    name = "mlx"

    def __init__(self, dtype: str = "float32", use_kernels: bool | None = None) -> None:
        if dtype not in DTYPES:
            raise BackendUnavailableError(f"the mlx backend runs in {', '.join(DTYPES)}, not {dtype}")
        should_use_kernel(use_kernels, "the conformance run")  # forcing Metal without it fails here
        self.dtype = dtype
        self.use_kernels = use_kernels
        self._mx_dtype = DTYPES[dtype]
        self.ops = MLXOps(mx.default_device(), use_kernels)

    def _in(self, x: np.ndarray) -> mx.array:
        return mx.array(np.asarray(x, dtype=np.float32)).astype(self._mx_dtype)

    @staticmethod
    def _stat(x: np.ndarray) -> mx.array:
        return mx.array(np.asarray(x, dtype=np.float32))

    # H2O stages
    def intra_attention(self, q, k, v, chunk_size, scale) -> stages.IntraResult:
        got = self.ops.intra_attention(self._in(q), self._in(k), self._in(v), chunk_size, scale)
        return stages.IntraResult(_np_state(got.state), _np(got.colsum))

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads) -> np.ndarray:
        return _np(self.ops.reduce_colsum_to_kv_heads(self._stat(colsum), n_kv_heads))

    def accumulate_scores(self, scores, memory, kv_colsum) -> np.ndarray:
        return _np(self.ops.accumulate_scores(self._stat(scores), _mx_memory(memory), self._stat(kv_colsum)))

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local,
                         heavy) -> stages.MemorySet:
        prev = _mx_memory(previous) if previous is not None else None
        return _np_memory(self.ops.build_memory_set(self._stat(scores), prev, chunk_index, chunk_start,
                                                    chunk_end, local, heavy))

    def gather_memory(self, k, v, memory) -> tuple[np.ndarray, np.ndarray]:
        k_mem, v_mem = self.ops.gather_memory(self._in(k), self._in(v), _mx_memory(memory))
        return _np(k_mem), _np(v_mem)

    def inter_attention(self, q, k_mem, v_mem, scale) -> stages.InterResult:
        got = self.ops.inter_attention(self._in(q), self._in(k_mem), self._in(v_mem), scale)
        return stages.InterResult(_np_state(got.state), _np(got.colsum))

    def merge_states(self, a, b) -> stages.AttentionState:
        def to_mx(s: stages.AttentionState) -> stages.AttentionState:
            return stages.AttentionState(self._stat(s.m), self._stat(s.l), self._in(s.o))
        return _np_state(self.ops.merge_states(to_mx(a), to_mx(b)))

    def attention_layer(self, q, k, v, config: H2OConfig, scale) -> stages.H2OLayerResult:
        """The one walk of core/methods/h2o.py over this backend's ops."""
        got = h2o_attention_layer(self.ops, self._in(q), self._in(k), self._in(v), config, scale)
        return stages.H2OLayerResult(_np(got.output), _np(got.scores), [_np_memory(m) for m in got.memory_sets])

    # speculative-prefill stages
    def attention_scores(self, queries, keys, scale) -> np.ndarray:
        return _np(self.ops.attention_scores(self._in(queries), self._in(keys), scale))

    def smooth_scores(self, probs, kernel) -> np.ndarray:
        return _np(self.ops.smooth_scores(self._stat(probs), kernel))

    def reduce_scores(self, probs, head_reduction, layer_reduction) -> np.ndarray:
        per_layer = self.ops.reduce_axis(self._stat(probs), head_reduction, axis=2)
        return _np(self.ops.reduce_axis(self.ops.reduce_axis(per_layer, layer_reduction, axis=1), "mean", axis=0))

    def select_tokens(self, importance, config: SpecPrefillConfig) -> stages.Selection:
        """Selection runs on the host for every backend (core/reference/specprefill.py, float64
        chunk means) from the importance the backend computed in float32."""
        return select_tokens(_np(self._stat(importance)), config)


def make_adapter(dtype: str = "float32", use_kernels: bool | None = None) -> MLXAdapter:
    """The registry's factory: MLX stages at `dtype` (float32, float16, bfloat16)."""
    return MLXAdapter(dtype, use_kernels)
