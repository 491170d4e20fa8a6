"""The hot stages: each module holds a Metal kernel built once by `_make_*_kernel()`, an MLX-ops
twin with identical semantics, and one dispatcher that picks the kernel where Metal exists."""

from .dispatch import choose_kernel, metal_available
from .inter import inter_attention
from .intra import intra_attention, reduce_colsum_to_kv_heads
from .scoring import attention_scores
from .state import add_sinks, empty_state, merge_states, slice_state

__all__ = [
    "add_sinks",
    "attention_scores",
    "choose_kernel",
    "empty_state",
    "inter_attention",
    "intra_attention",
    "merge_states",
    "metal_available",
    "reduce_colsum_to_kv_heads",
    "slice_state",
]
