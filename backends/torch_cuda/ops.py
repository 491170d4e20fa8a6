"""The ops protocol (core/ops.py) on torch tensors: what the one walk of each method calls.

The hot stages go through the kernels/ dispatchers (Triton on CUDA, torch twins elsewhere, or
forced by `use_kernels`); the rest is in method_ops.py. Softmax
statistics and scores are float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any, Sequence

import numpy as np
import torch

import specfill.backends.torch_cuda.method_ops as method_ops
import specfill.backends.torch_cuda.placement as placement  # a module reference: simulated_cuda swaps RUNTIME
from specfill.core.config import REDUCTIONS
from specfill.core.cpu import process_peak_memory_gb, reset_process_peak_memory
from specfill.core.ops import KernelStages, cannot_split
from specfill.core.stages import AttentionTerms, active_terms

from .attention import causal_attention as causal_step_attention
from .attention import terms_attention, windowed_attention
from .cache import ModelKVCache
from .method_ops import stage_kernels
from .model import Transformer, few_row_products

MAX_GRAPH_TOKENS = 16  # decode and verify steps up to this many tokens take the static path (decode_graph.py)


def own_family(model: Any) -> None:
    """A nested speculator (SpecPrefillConfig.deep_keep) runs its blocks in two parts: specfill's
    own model families (model.py) only."""
    if not isinstance(model, Transformer):
        raise cannot_split()


class TorchOps(KernelStages):
    """The torch backend's ops on one device. use_kernels: None = Triton on CUDA and the
    twins elsewhere; True / False force one."""

    name = "cuda"
    lazy = False  # eager: a decode step after the token it follows has been handed out

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        use_kernels: bool | None = None,
        decode_graphs: bool | None = None,
        walk_graphs: bool | None = None,
    ):
        self.device = torch.device(device)
        self.dtype = dtype
        self.use_kernels = use_kernels
        # decode steps (and drafting's verify steps) as replayed CUDA graphs (decode_graph.py):
        # None = on a CUDA device; False runs the same static steps eagerly (same tokens)
        on_gpu = self.device.type == "cuda"
        graphs = on_gpu if decode_graphs is None else decode_graphs
        self.static_decode = on_gpu  # CPU keeps its own few-query attention (attention.few_queries_cpu)
        self.decode_graphs: Any = None  # decode_graph.DecodeGraphs where static steps run (imported there only)
        if on_gpu or graphs:
            from .decode_graph import CudaGraphCapture, DecodeGraphs

            self.decode_graphs = DecodeGraphs(CudaGraphCapture() if graphs else None)
        # H2O's batches as CUDA graphs replayed over the layers (walk_graph.py): None = on a CUDA device
        self.walk_capture: Any = None  # walk_graph.WalkCapture where batches are captured
        self.walk_stats: Any = None  # walk_graph.WalkGraphStats: captures, replays, why refused
        if on_gpu if walk_graphs is None else walk_graphs:
            from .walk_graph import CudaWalkCapture, WalkGraphStats

            self.walk_capture, self.walk_stats = CudaWalkCapture(), WalkGraphStats()

    # the stages (intra_attention, inter_attention, attention_scores, ...: KernelStages; the dispatchers check shapes)
    stage_kernels = staticmethod(stage_kernels)
    method_ops = method_ops

    def causal_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return method_ops.causal_attention(q, k, v, scale, self.use_kernels)

    def walk_replay(self) -> Any:
        """A prompt's H2O batches: captured and replayed over the layers where walk graphs are on
        (walk_graph.WalkGraphs), else run as they come."""
        if self.walk_capture is None:
            return super().walk_replay()
        from .walk_graph import WalkGraphs

        return WalkGraphs(self.walk_capture, self.walk_stats)

    def concat(self, arrays: Sequence[torch.Tensor], axis: int) -> torch.Tensor:
        return torch.cat(list(arrays), dim=axis)

    def layer_scores(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms[torch.Tensor] | None = None,
        query_start: int | None = None,
        kernel: int = 1,
        how: str = "max",
    ) -> torch.Tensor:
        """Where the scoring stage runs its CPU twin (auto picks no kernel on this device: not a GPU's,
        nor a simulated one's; the kernel not forced by use_kernels or SPECFILL_KERNELS=on) and there
        are no attention terms, the three stages fused (kernels/scoring.pooled_head_scores); else
        KernelStages' composition, which also says what is wrong with a kernel or a reduction."""
        from specfill.core.self_check import kernels_setting  # imported by a scoring's first layer only

        from .kernels import dispatch  # a module reference: where auto picks the kernel (tests patch it)

        twin = not dispatch.kernel_device_auto(queries.device) and kernels_setting(self.use_kernels) is not True
        if twin and active_terms(terms) is None and kernel >= 1 and kernel % 2 == 1 and how in REDUCTIONS:
            return stage_kernels().pooled_head_scores(queries, keys, scale, window, query_start, kernel, how)
        return super().layer_scores(queries, keys, scale, window, terms, query_start, kernel, how)

    def zero_scores(self, n_kv_heads: int, n_tokens: int, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros((n_kv_heads, n_tokens), dtype=stage_kernels().stats_dtype(like), device=like.device)

    def cast_like(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return x.to(like.dtype)

    def stage_scope(self, like: torch.Tensor) -> AbstractContextManager[Any]:
        return stage_kernels().units_scope(like.device)  # many small ops on CPU: one thread team per stage

    # model runtime
    @property
    def device_name(self) -> str:
        device = self.device
        return f"{device} ({placement.RUNTIME.properties(device).name})" if placement.on_cuda(device) else str(device)

    @property
    def compute_threads(self) -> int:
        return torch.get_num_threads()

    def activation_dtype(self, model: Transformer) -> torch.dtype:
        return model.embed_tokens.weight.dtype

    def device_scope(self) -> AbstractContextManager[Any]:
        return torch.inference_mode()

    def verify_scope(self) -> AbstractContextManager[Any]:
        return few_row_products()

    def tokens(self, ids: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)

    def _positions(self, positions, steps: int) -> torch.Tensor:
        if isinstance(positions, int):
            return torch.arange(positions, positions + steps, device=self.device)
        return torch.as_tensor(positions, dtype=torch.int64, device=self.device)

    def forward(self, model: Transformer, ids, positions, cache, attend, logits_from) -> torch.Tensor | None:
        pos = self._positions(positions, ids.shape[0])
        if (
            self.static_decode
            and self.decode_graphs is not None
            and self._static_step(model, ids, cache, attend, logits_from)
        ):
            logits = self.decode_graphs.run(model, ids, pos, cache)
            return logits if logits_from == 0 else logits[logits_from:]
        logits = model(ids[None], pos, cache, logits_from, attend)
        return None if logits is None else logits[0]

    def capture_step(
        self, model: Any, ids: torch.Tensor, position: int, cache: Any, layers: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The look-ahead's step as a static decode step keeping the layers' queries, replayed as a CUDA
        graph after its first run (decode_graph.DecodeGraphs.run_keeping): ~10 launches a layer and no
        Python between them, where the capture's eager step launches them one by one. Not where the steps
        are compiled: a look-ahead's bucket is new with every prompt length, and so would its compilation be."""
        graphs = self.decode_graphs
        if not (self.static_decode and graphs is not None and not graphs.compiled):
            return None
        if not self._static_step(model, ids, cache, None, 0):
            return None
        pos = self._positions(position, ids.shape[0])
        return graphs.run_keeping(model, ids, pos, cache, tuple(layers))

    def layer_states(self, model: Transformer, ids, positions, cache, attend) -> torch.Tensor:
        own_family(model)
        return model.states(ids[None], self._positions(positions, ids.shape[0]), cache, attend)[0]

    def forward_from(
        self, model: Transformer, first_layer: int, states, positions, cache, attend, logits_from
    ) -> torch.Tensor | None:
        own_family(model)
        pos = self._positions(positions, states.shape[0])
        logits = model.from_layer(first_layer, states[None], pos, cache, logits_from, attend)
        return None if logits is None else logits[0]

    @staticmethod
    def _static_step(model: Any, ids: torch.Tensor, cache: Any, attend: Any, logits_from: int | None) -> bool:
        """A decode or verify step of a plain decoder (decode_graph.py); prompts, H2O, the
        speculator's capture and adapted models (their own caches) take the eager path."""
        return (
            attend is None
            and logits_from is not None
            and 1 <= ids.shape[0] <= MAX_GRAPH_TOKENS
            and isinstance(model, Transformer)
            and isinstance(cache, ModelKVCache)
        )

    def decode_setup_seconds(self) -> float:
        """Seconds spent so far preparing decode steps (first runs and graph captures)."""
        return 0.0 if self.decode_graphs is None else self.decode_graphs.setup_seconds

    def schedule(self, arrays: list[Any]) -> None:
        """CUDA queues work by itself; nothing to do."""

    def settle(self, arrays: list[Any]) -> None:
        """Eager: every result is already computed (or queued on the CUDA stream)."""

    def wall_time(self) -> float:
        if placement.on_cuda(self.device):
            placement.RUNTIME.synchronize(self.device)
        return time.perf_counter()

    def new_cache(self, model: Transformer, capacity: int) -> ModelKVCache:
        if hasattr(model, "new_cache"):  # an adapted model (adapted.py): a hybrid's cache holds recurrent state too
            return model.new_cache(capacity)
        return ModelKVCache.allocate(
            model.args, capacity, model.embed_tokens.weight.dtype, model.embed_tokens.weight.device
        )

    def first_layers(self, model: Transformer, n_layers: int) -> Transformer:
        return model.first_layers(n_layers)

    def splits(self, model: Any) -> bool:
        return isinstance(model, Transformer)

    plain_step = staticmethod(causal_step_attention)
    terms_step = staticmethod(terms_attention)
    windowed_step = staticmethod(windowed_attention)

    def slot_positions(self, k: torch.Tensor) -> torch.Tensor:
        return torch.arange(k.shape[2], device=k.device)

    def last_queries(self, q: torch.Tensor, n: int) -> torch.Tensor:
        return q[0, :, q.shape[2] - n :].transpose(0, 1).clone(memory_format=torch.contiguous_format)  # a copy

    def stack(self, arrays: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.stack(list(arrays))

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1, keepdim=True)

    def item(self, x: torch.Tensor) -> int:
        return int(x.reshape(-1)[0])

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        x = x.detach().cpu()
        return (x.float() if x.dtype in (torch.float16, torch.bfloat16) else x).numpy()

    def peak_memory_gb(self) -> float:
        """Peak CUDA memory allocated by torch, or the process's peak resident set on CPU."""
        if placement.on_cuda(self.device):
            return placement.RUNTIME.peak_memory_bytes(self.device) / 1e9
        return process_peak_memory_gb()

    def reset_peak_memory(self) -> bool:
        if placement.on_cuda(self.device):
            placement.RUNTIME.reset_peak_memory(self.device)
            return True
        return reset_process_peak_memory()
