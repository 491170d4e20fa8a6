"""The conformance adapter: the MLX stages behind NumPy in, NumPy out.

Inputs arrive as float64 NumPy arrays already rounded to the dtype under test; they become MLX
arrays of that dtype (statistics, scores and probabilities stay float32, as in the stages) and
results go back as NumPy arrays. `attention_layer` runs this backend's own orchestration.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from specfill.core import stages
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import BackendUnavailableError

from . import h2o, kernels, specprefill
from .kernels.dispatch import should_use_kernel

DTYPES: dict[str, mx.Dtype] = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def _np(x: mx.array) -> np.ndarray:
    """MLX -> NumPy (bfloat16 has no NumPy dtype: widen to float32 first)."""
    return np.array(x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x)


def _np_state(state: kernels.AttentionState) -> stages.AttentionState:
    return stages.AttentionState(_np(state.m), _np(state.l), _np(state.o))


def _np_memory(memory: h2o.MemorySet) -> stages.MemorySet:
    return stages.MemorySet(np.array(memory.indices).astype(np.int64), memory.chunk_index)


def _mx_memory(memory: stages.MemorySet) -> h2o.MemorySet:
    return h2o.MemorySet(mx.array(np.asarray(memory.indices, dtype=np.int32)), memory.chunk_index)


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

    def _in(self, x: np.ndarray) -> mx.array:
        return mx.array(np.asarray(x, dtype=np.float32)).astype(self._mx_dtype)

    @staticmethod
    def _stat(x: np.ndarray) -> mx.array:
        return mx.array(np.asarray(x, dtype=np.float32))

    # H2O stages
    def intra_attention(self, q, k, v, chunk_size, scale) -> stages.IntraResult:
        got = kernels.intra_attention(self._in(q), self._in(k), self._in(v), chunk_size, scale,
                                      use_kernel=self.use_kernels)
        return stages.IntraResult(_np_state(got.state), _np(got.colsum))

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads) -> np.ndarray:
        return _np(kernels.reduce_colsum_to_kv_heads(self._stat(colsum), n_kv_heads))

    def accumulate_scores(self, scores, memory, kv_colsum) -> np.ndarray:
        return _np(h2o.accumulate_scores(self._stat(scores), _mx_memory(memory), self._stat(kv_colsum)))

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local,
                         heavy) -> stages.MemorySet:
        prev = _mx_memory(previous) if previous is not None else None
        return _np_memory(h2o.build_memory_set(self._stat(scores), prev, chunk_index, chunk_start,
                                               chunk_end, local, heavy))

    def gather_memory(self, k, v, memory) -> tuple[np.ndarray, np.ndarray]:
        k_mem, v_mem = h2o.gather_memory(self._in(k), self._in(v), _mx_memory(memory))
        return _np(k_mem), _np(v_mem)

    def inter_attention(self, q, k_mem, v_mem, scale) -> stages.InterResult:
        got = kernels.inter_attention(self._in(q), self._in(k_mem), self._in(v_mem), scale,
                                      use_kernel=self.use_kernels)
        return stages.InterResult(_np_state(got.state), _np(got.colsum))

    def merge_states(self, a, b) -> stages.AttentionState:
        def to_mx(s: stages.AttentionState) -> kernels.AttentionState:
            return kernels.AttentionState(self._stat(s.m), self._stat(s.l), self._in(s.o))
        return _np_state(kernels.merge_states(to_mx(a), to_mx(b)))

    def attention_layer(self, q, k, v, config: H2OConfig, scale) -> stages.H2OLayerResult:
        got = h2o.h2o_attention_layer(self._in(q), self._in(k), self._in(v), config, scale,
                                      use_kernels=self.use_kernels)
        return stages.H2OLayerResult(_np(got.output), _np(got.scores),
                                     [_np_memory(m) for m in got.memory_sets])

    # speculative-prefill stages
    def attention_scores(self, queries, keys, scale) -> np.ndarray:
        return _np(kernels.attention_scores(self._in(queries), self._in(keys), scale,
                                            use_kernel=self.use_kernels))

    def smooth_scores(self, probs, kernel) -> np.ndarray:
        return _np(specprefill.smooth_scores(self._stat(probs), kernel))

    def reduce_scores(self, probs, head_reduction, layer_reduction) -> np.ndarray:
        return _np(specprefill.reduce_scores(self._stat(probs), head_reduction, layer_reduction))

    def select_tokens(self, importance, config: SpecPrefillConfig) -> stages.Selection:
        got = specprefill.select_tokens(self._stat(importance), config)
        return stages.Selection(kept=np.array(got.kept).astype(np.int64),
                                position_ids=np.array(got.position_ids).astype(np.int64),
                                decode_start=got.decode_start, chunk_scores=_np(got.chunk_scores))


def make_adapter(dtype: str = "float32", use_kernels: bool | None = None) -> MLXAdapter:
    """The registry's factory: MLX stages at `dtype` (float32, float16, bfloat16)."""
    return MLXAdapter(dtype, use_kernels)
