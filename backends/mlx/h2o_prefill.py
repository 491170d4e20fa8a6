"""H2O two-phase chunked sparse prefill of the whole MLX model (seed 001; stages in h2o.py).

Schedule: logical batch by logical batch (B tokens), and within a batch layer by layer. Each layer
projects q/k/v of all the batch's tokens, writes k/v to the KV cache, then runs phase 1 for every
chunk at once and the phase-2 chunk walk with that layer's carry (scores and memory sets from the
previous batches); o_proj and the MLP then run on all the batch's tokens before the next layer.
This gives every query i of chunk C_c exactly the keys K(i) = {j in C_c : j <= i} U M_{c-1}.
The graph of one logical batch is evaluated at once (with the carries), so memory stays bounded
by one batch's activations.

The KV cache keeps every prompt position, so decoding afterwards is full attention; H2O state
is dropped once the prompt is in. Mirrors backends/torch_cuda/h2o_prefill.py.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from specfill.core.config import H2OConfig
from specfill.core.runtime import ProgressCallback

from .cache import KVCache
from .generate import prefill
from .h2o import H2OCarry, h2o_attention_batch
from .model import Model


class H2OPrefillAttention:
    """The `PrefillAttention` of H2O prefill over a prompt of `n_tokens`: one carry per layer,
    advanced by each logical batch."""

    def __init__(self, config: H2OConfig, n_layers: int, n_kv_heads: int, head_dim: int,
                 n_tokens: int, use_kernels: bool | None = None):
        self.config = config
        self.n_tokens = n_tokens
        self.scale = head_dim**-0.5
        self.use_kernels = use_kernels
        self.carries = [H2OCarry.start(n_kv_heads) for _ in range(n_layers)]

    def __call__(self, layer: int, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        end = k.shape[2]
        start = end - q.shape[2]
        carry = self.carries[layer]
        if carry.n_done != start:
            raise ValueError(f"layer {layer}: H2O batch starts at slot {start}, the carry is at "
                             f"{carry.n_done}")
        # memory sets point back into earlier batches: hand over every key stored so far
        out, self.carries[layer] = h2o_attention_batch(
            q[0], k[0], v[0], carry, self.config, self.scale, is_last=end == self.n_tokens,
            use_kernels=self.use_kernels)
        return out[None]

    def arrays(self) -> list[mx.array]:
        """The carries' scores and memory sets (evaluating an evaluated one costs nothing)."""
        return [carry.scores for carry in self.carries] + [
            memory.indices for carry in self.carries for memory in carry.memory_sets]

    def memory_sets(self) -> list[list[np.ndarray]]:
        """Per layer, M_0 .. M_{k-2} as int64 NumPy arrays [Hkv, L + H]."""
        return [[np.asarray(m.indices).astype(np.int64) for m in carry.memory_sets]
                for carry in self.carries]


def uses_full_attention(config: H2OConfig, n_tokens: int) -> bool:
    """H2O is plain causal attention for a prompt of one chunk or with no memory (L + H = 0)."""
    return not config.enabled or n_tokens <= config.chunk_size


def h2o_prefill(model: Model, ids: mx.array, cache: list[KVCache], config: H2OConfig, *,
                logits_from: int = -1, step_size: int, use_kernels: bool | None = None,
                progress: ProgressCallback | None = None) -> tuple[mx.array, list[list[np.ndarray]]]:
    """H2O prefill of ids [N] at positions 0..N-1 into cache slots 0..N-1.

    Returns float32 logits for the tokens from index `logits_from` (as generate.prefill) and the
    memory sets built per layer. Where H2O is plain causal attention (see uses_full_attention)
    the model's full-attention prefill runs, in steps of `step_size`; otherwise one step per
    logical batch, and `progress` is called after each.
    """
    n_tokens = ids.shape[0]
    args = model.args
    if uses_full_attention(config, n_tokens):
        logits = prefill(model, ids, cache, step_size=step_size, logits_from=logits_from,
                         progress=progress)
        return logits, [[] for _ in range(args.num_hidden_layers)]
    attend = H2OPrefillAttention(config, args.num_hidden_layers, args.num_key_value_heads,
                                 args.head_dim, n_tokens, use_kernels)
    logits = prefill(model, ids, cache, step_size=config.batch_size, logits_from=logits_from,
                     attend=attend, progress=progress)
    return logits, attend.memory_sets()
