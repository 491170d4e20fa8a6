"""The ops protocol (core/ops.py) on mx.arrays: what the one walk of each method calls.

The hot stages go through the kernels/ dispatchers (Metal where it exists, MLX-ops twins
elsewhere, or forced by `use_kernels`); the rest is in method_ops.py.
MLX is lazy: `settle` evaluates a prefill step's cache and method state (bounding the graph),
`schedule` starts the next decode step while the current token is handed out (mlx-lm's overlap).
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

import specfill.backends.mlx.method_ops as method_ops
from specfill.core.cpu import process_peak_memory_gb, reset_process_peak_memory
from specfill.core.ops import KernelStages, cannot_split

from .cache import LayerKVCache, ModelKVCache, make_cache
from .method_ops import stage_kernels
from .model import LayerView, Model, causal_attention, terms_attention, windowed_attention
from .model import causal_attention as causal_step_attention


class MLXOps(KernelStages):
    """The MLX backend's ops on one device. use_kernels: None = the Metal kernels where Metal
    exists and the MLX-ops twins elsewhere; True / False force one. quantized: some of the
    model's layers run quantized matmul (reported by load)."""

    name = "mlx"
    lazy = True

    def __init__(self, device: mx.Device, use_kernels: bool | None = None, quantized: bool = False):
        self.device = device
        self.use_kernels = use_kernels
        self.quantized = quantized

    # H2O stages (intra_attention, inter_attention, reduce_colsum_to_kv_heads, merge_states: KernelStages)
    stage_kernels = staticmethod(stage_kernels)
    method_ops = method_ops

    def causal_attention(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
        return causal_attention(q[None], k[None], v[None], scale)[0]

    def concat(self, arrays: Sequence[mx.array], axis: int) -> mx.array:
        return mx.concatenate(list(arrays), axis=axis)

    def zero_scores(self, n_kv_heads: int, n_tokens: int, like: mx.array) -> mx.array:
        return mx.zeros((n_kv_heads, n_tokens), dtype=mx.float32)

    def cast_like(self, x: mx.array, like: mx.array) -> mx.array:
        return x.astype(like.dtype)

    def stage_scope(self, like: mx.array) -> AbstractContextManager[Any]:
        return mx.stream(self.device)

    # SpecPrefill scoring (attention_scores: KernelStages)

    # model runtime
    @property
    def device_name(self) -> str:
        return "gpu (Metal)" if self.device.type == mx.DeviceType.gpu else "cpu"

    @property
    def compute_threads(self) -> int:
        """MLX's CPU ops run on its BLAS (OpenBLAS / Accelerate): that library's thread setting."""
        return int(os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)

    def activation_dtype(self, model: Model) -> mx.Dtype:
        return model.model.norm.weight.dtype  # the final norm's weights keep the activation dtype

    def device_scope(self) -> AbstractContextManager[Any]:
        return mx.stream(self.device)

    def verify_scope(self) -> AbstractContextManager[Any]:
        return nullcontext()  # MLX's matmul has no few-row penalty to avoid

    def tokens(self, ids: np.ndarray) -> mx.array:
        return mx.array(np.asarray(ids, dtype=np.int32))

    def forward(self, model: Model | LayerView, ids, positions, cache, attend, logits_from) -> mx.array | None:
        pos = _positions(positions)
        return _logits(
            model, ids.shape[0], logits_from, lambda rows: model.hidden(ids[None], pos, cache, attend, rows_from=rows)
        )

    def layer_states(self, model: Model | LayerView, ids, positions, cache, attend) -> mx.array:
        if not isinstance(model, (Model, LayerView)):  # an adapted family (adapted.py): mlx-lm's forward
            raise cannot_split()
        return model.states(ids[None], _positions(positions), cache, attend)[0]

    def forward_from(self, model: Model, first_layer: int, states, positions, cache, attend, logits_from):
        if not isinstance(model, Model):
            raise cannot_split()
        pos, h = _positions(positions), states[None]
        run = lambda rows: model.from_layer(first_layer, h, pos, cache, attend, rows)  # noqa: E731
        return _logits(model, states.shape[0], logits_from, run)

    def capture_step(self, model: Any, ids: mx.array, position: int, cache: Any, layers: Sequence[int]) -> None:
        return None  # lazy: forward with the capture builds one graph a step already

    def schedule(self, arrays: list[Any]) -> None:
        mx.async_eval(arrays)

    def settle(self, arrays: list[Any]) -> None:
        mx.eval(_flatten(arrays))

    def wall_time(self) -> float:
        return time.perf_counter()

    def decode_setup_seconds(self) -> float:
        return 0.0  # MLX compiles nothing per decode step here

    def new_cache(self, model: Model | LayerView, capacity: int) -> ModelKVCache:
        return make_cache(model.args, capacity)

    def first_layers(self, model: Model, n_layers: int) -> LayerView:
        return model.first_layers(n_layers)

    def splits(self, model: Any) -> bool:
        return isinstance(model, Model)  # a LayerView ("self:K") has no deeper blocks of its own to run

    plain_step = staticmethod(causal_step_attention)
    terms_step = staticmethod(terms_attention)
    windowed_step = staticmethod(windowed_attention)

    def slot_positions(self, k: mx.array) -> np.ndarray:
        return np.arange(k.shape[2])

    def last_queries(self, q: mx.array, n: int) -> mx.array:
        return mx.contiguous(q[0, :, q.shape[2] - n :].transpose(1, 0, 2))  # a copy: no view of the step's q

    def stack(self, arrays: Sequence[mx.array]) -> mx.array:
        return mx.stack(list(arrays))

    def argmax(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[None], axis=-1)

    def item(self, x: mx.array) -> int:
        return int(x.reshape(-1)[0].item())

    def to_numpy(self, x: mx.array) -> np.ndarray:
        return np.asarray(x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x)

    def peak_memory_gb(self) -> float:
        """MLX's peak allocation on the GPU, or the process's peak resident set on CPU."""
        if self.device.type == mx.DeviceType.gpu:
            return mx.get_peak_memory() / 1e9
        return process_peak_memory_gb()

    def reset_peak_memory(self) -> bool:
        if self.device.type == mx.DeviceType.gpu:
            mx.reset_peak_memory()
            return True
        return reset_process_peak_memory()


def _flatten(items: list[Any]) -> list[Any]:
    """Caches (ModelKVCache, LayerKVCache) and nested lists of arrays as one flat list of arrays."""
    flat: list[Any] = []
    for item in items:
        if isinstance(item, list):
            flat.extend(_flatten(item))
        else:
            flat.extend(item.state if isinstance(item, (ModelKVCache, LayerKVCache)) else [item])
    return flat


def _positions(positions):
    """RoPE positions as the model takes them: an int (the first of consecutive ones) or int32 [T]."""
    return positions if isinstance(positions, int) else mx.array(np.asarray(positions, dtype=np.int32))


def _logits(model: Model | LayerView, steps: int, logits_from: int | None, hidden_of) -> mx.array | None:
    """A step's float32 logits [steps - logits_from, vocab] (None: none asked): hidden_of(rows_from)
    runs the blocks, whose last computes the rows from rows_from on (the keys and values of all)."""
    if logits_from is not None and logits_from < 0:
        logits_from += steps
    hidden = hidden_of(steps if logits_from is None else logits_from)
    if logits_from is None:
        return None
    return model.logits(hidden[:, logits_from - (steps - hidden.shape[1]) :]).astype(mx.float32)[0]
