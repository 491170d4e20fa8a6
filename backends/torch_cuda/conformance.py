"""The conformance adapter of the torch backend: its stages behind NumPy in, NumPy out.

Inputs arrive as float64 NumPy arrays already rounded to the dtype under test; they become
torch tensors of that dtype on the adapter's device, and results go back as NumPy. Softmax
statistics and scores stay float32 (float64 at float64). `attention_layer` runs this backend's
own orchestration (backends/torch_cuda/h2o.py), not the core's.
"""
from __future__ import annotations

import numpy as np
import torch

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import BackendUnavailableError
from specfill.core.stages import (AttentionState, H2OLayerResult, InterResult, IntraResult, MemorySet,
                                  Selection)

from . import h2o, specprefill
from .kernels import inter_attention, intra_attention, kernel_unavailable_reason
from .kernels.state import AttentionState as TorchState

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

    def _in(self, *arrays: np.ndarray, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
        return tuple(torch.as_tensor(np.asarray(a), device=self.device).to(dtype or self.torch_dtype)
                     for a in arrays)

    def _stats(self, *arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
        return self._in(*arrays, dtype=self.stats_dtype)

    def _indices(self, memory: MemorySet | None) -> torch.Tensor | None:
        if memory is None:
            return None
        return torch.as_tensor(np.asarray(memory.indices), dtype=torch.int64, device=self.device)

    @staticmethod
    def _state(state: TorchState) -> AttentionState:
        return AttentionState(*(_numpy(x) for x in state))

    # H2O stages
    def intra_attention(self, q, k, v, chunk_size, scale) -> IntraResult:
        result = intra_attention(*self._in(q, k, v), chunk_size, scale, use_kernel=self.use_kernels)
        return IntraResult(self._state(result.state), _numpy(result.colsum))

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads) -> np.ndarray:
        return _numpy(h2o.reduce_colsum_to_kv_heads(*self._stats(colsum), n_kv_heads))

    def accumulate_scores(self, scores, memory, kv_colsum) -> np.ndarray:
        scores_t, colsum_t = self._stats(scores, kv_colsum)
        return _numpy(h2o.accumulate_scores(scores_t, self._indices(memory), colsum_t))

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy) -> MemorySet:
        indices = h2o.build_memory_set(*self._stats(scores), self._indices(previous), chunk_start, chunk_end,
                                       local, heavy)
        return MemorySet(_numpy(indices), chunk_index)

    def gather_memory(self, k, v, memory) -> tuple[np.ndarray, np.ndarray]:
        k_mem, v_mem = h2o.gather_memory(*self._in(k, v), self._indices(memory))
        return _numpy(k_mem), _numpy(v_mem)

    def inter_attention(self, q, k_mem, v_mem, scale) -> InterResult:
        result = inter_attention(*self._in(q, k_mem, v_mem), scale, use_kernel=self.use_kernels)
        return InterResult(self._state(result.state), _numpy(result.colsum))

    def merge_states(self, a, b) -> AttentionState:
        def state(s: AttentionState) -> TorchState:
            return TorchState(*self._stats(s.m, s.l), *self._in(s.o))
        return self._state(h2o.merge_states(state(a), state(b)))

    def attention_layer(self, q, k, v, config: H2OConfig, scale) -> H2OLayerResult:
        out = h2o.h2o_attention_layer(*self._in(q, k, v), config, scale, use_kernels=self.use_kernels)
        sets = [MemorySet(_numpy(m), c) for c, m in enumerate(out.memory_sets)]
        return H2OLayerResult(_numpy(out.output), _numpy(out.scores), sets)

    # speculative-prefill stages
    def attention_scores(self, queries, keys, scale) -> np.ndarray:
        return _numpy(specprefill.attention_scores(*self._in(queries, keys), scale, use_kernel=self.use_kernels))

    def smooth_scores(self, probs, kernel) -> np.ndarray:
        return _numpy(specprefill.smooth_scores(*self._stats(probs), kernel))

    def reduce_scores(self, probs, head_reduction, layer_reduction) -> np.ndarray:
        return _numpy(specprefill.reduce_scores(*self._stats(probs), head_reduction, layer_reduction))

    def select_tokens(self, importance, config: SpecPrefillConfig) -> Selection:
        chosen = specprefill.select_tokens(*self._stats(importance), config)
        return Selection(kept=_numpy(chosen.kept), position_ids=_numpy(chosen.position_ids),
                         decode_start=chosen.decode_start, chunk_scores=_numpy(chosen.chunk_scores))


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
