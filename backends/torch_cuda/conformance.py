"""The conformance adapter of the torch backend: its stages behind NumPy in, NumPy out.

Inputs arrive as float64 NumPy arrays already rounded to the dtype under test; they become
torch tensors of that dtype on the adapter's device, and results go back as NumPy. Softmax
statistics and scores stay float32 (float64 at float64). `attention_layer` runs
the one walk of core/methods/h2o.py over this backend's ops (backends/torch_cuda/ops.py).
"""
from __future__ import annotations

import numpy as np
import torch

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import BackendUnavailableError
from specfill.core.methods.h2o import h2o_attention_layer
from specfill.core.reference.specprefill import select_tokens
from specfill.core.stages import (AttentionState, H2OLayerResult, InterResult, IntraResult, MemorySet,
                                  Selection)

from .kernels import kernel_unavailable_reason
from .ops import TorchOps

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def _numpy(x: torch.Tensor) -> np.ndarray:
    x = x.detach().cpu()
    return (x.float() if x.dtype in (torch.float16, torch.bfloat16) else x).numpy()


class TorchStagesAdapter:
    """Every stage of both methods on one torch device at one compute dtype."""

    name = "cuda"

    def __init__(self, dtype: str, use_kernels: bool | None, device: torch.device) -> None:
        self.dtype = dtype
        self.torch_dtype = DTYPES[dtype]
        self.stats_dtype = torch.float64 if dtype == "float64" else torch.float32
        self.use_kernels = use_kernels
        self.device = device
        self.ops = TorchOps(device, self.torch_dtype, use_kernels)

    def _in(self, *arrays: np.ndarray, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
        return tuple(torch.as_tensor(np.asarray(a), device=self.device).to(dtype or self.torch_dtype)
                     for a in arrays)

    def _stats(self, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
        return self._in(*arrays, dtype=self.stats_dtype)

    def _memory(self, memory: MemorySet | None) -> MemorySet | None:
        if memory is None:
            return None
        indices = torch.as_tensor(np.asarray(memory.indices), dtype=torch.int64, device=self.device)
        return MemorySet(indices, memory.chunk_index)

    def _state_in(self, s: AttentionState) -> AttentionState:
        return AttentionState(*self._stats(s.m, s.l), *self._in(s.o))

    @staticmethod
    def _state(state: AttentionState) -> AttentionState:
        return AttentionState(_numpy(state.m), _numpy(state.l), _numpy(state.o))

    # H2O stages
    def intra_attention(self, q, k, v, chunk_size, scale) -> IntraResult:
        result = self.ops.intra_attention(*self._in(q, k, v), chunk_size, scale)
        return IntraResult(self._state(result.state), _numpy(result.colsum))

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads) -> np.ndarray:
        return _numpy(self.ops.reduce_colsum_to_kv_heads(*self._stats(colsum), n_kv_heads))

    def accumulate_scores(self, scores, memory, kv_colsum) -> np.ndarray:
        scores_t, colsum_t = self._stats(scores, kv_colsum)
        return _numpy(self.ops.accumulate_scores(scores_t, self._memory(memory), colsum_t))

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy) -> MemorySet:
        memory = self.ops.build_memory_set(*self._stats(scores), self._memory(previous), chunk_index, chunk_start,
                                           chunk_end, local, heavy)
        return MemorySet(_numpy(memory.indices), chunk_index)

    def gather_memory(self, k, v, memory) -> tuple[np.ndarray, np.ndarray]:
        k_mem, v_mem = self.ops.gather_memory(*self._in(k, v), self._memory(memory))
        return _numpy(k_mem), _numpy(v_mem)

    def inter_attention(self, q, k_mem, v_mem, scale) -> InterResult:
        result = self.ops.inter_attention(*self._in(q, k_mem, v_mem), scale)
        return InterResult(self._state(result.state), _numpy(result.colsum))

    def merge_states(self, a, b) -> AttentionState:
        return self._state(self.ops.merge_states(self._state_in(a), self._state_in(b)))

    def attention_layer(self, q, k, v, config: H2OConfig, scale) -> H2OLayerResult:
        """The one walk of core/methods/h2o.py over this backend's ops."""
        out = h2o_attention_layer(self.ops, *self._in(q, k, v), config, scale)
        sets = [MemorySet(_numpy(m.indices), m.chunk_index) for m in out.memory_sets]
        return H2OLayerResult(_numpy(out.output), _numpy(out.scores), sets)

    # speculative-prefill stages
    def attention_scores(self, queries, keys, scale) -> np.ndarray:
        return _numpy(self.ops.attention_scores(*self._in(queries, keys), scale))

    def smooth_scores(self, probs, kernel) -> np.ndarray:
        return _numpy(self.ops.smooth_scores(*self._stats(probs), kernel))

    def reduce_scores(self, probs, head_reduction, layer_reduction) -> np.ndarray:
        per_layer = self.ops.reduce_axis(*self._stats(probs), head_reduction, axis=2)
        return _numpy(self.ops.reduce_axis(self.ops.reduce_axis(per_layer, layer_reduction, axis=1), "mean", axis=0))

    def select_tokens(self, importance, config: SpecPrefillConfig) -> Selection:
        """Selection runs on the host for every backend (core/reference/specprefill.py, float64
        chunk means) from the importance the backend computed in its statistics dtype."""
        return select_tokens(_numpy(*self._stats(importance)), config)


def make_adapter(dtype: str = "float32", use_kernels: bool | None = None,
                 device: str | torch.device | None = None) -> TorchStagesAdapter:
    """The torch backend's stages at `dtype` on `device` (default: CUDA when available, else CPU).

    use_kernels True forces the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1), False
    the torch twins, None lets each dispatcher choose (kernels on CUDA).
    """
    if dtype not in DTYPES:
        raise BackendUnavailableError(f"the torch backend computes in {', '.join(DTYPES)}, not {dtype}")
    resolved = torch.device(device) if device is not None else \
        torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(f"device {resolved} requested but torch {torch.__version__} sees no CUDA GPU")
    if use_kernels:
        reason = kernel_unavailable_reason(resolved, DTYPES[dtype])
        if reason is not None:
            raise BackendUnavailableError(reason)
    return TorchStagesAdapter(dtype, use_kernels, resolved)
