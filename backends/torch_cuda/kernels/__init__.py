"""The hot stages of both methods: a Triton kernel and a torch-ops twin each, one dispatcher.

Dispatchers take `use_kernel`: None runs the kernel on CUDA tensors and the twin elsewhere,
True forces the kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1), False forces the twin.
"""

from .cpu_units import units_scope
from .dispatch import choose_kernel, kernel_unavailable_reason
from .inter import inter_attention, inter_attention_twin
from .intra import check_attention_shapes, intra_attention, intra_attention_twin, reduce_colsum_to_kv_heads
from .scoring import attention_scores, attention_scores_twin, check_scoring_shapes, pooled_head_scores
from .state import add_sinks, empty_state, merge_states, stats_dtype

__all__ = [
    "add_sinks",
    "attention_scores",
    "attention_scores_twin",
    "check_attention_shapes",
    "check_scoring_shapes",
    "choose_kernel",
    "empty_state",
    "inter_attention",
    "inter_attention_twin",
    "intra_attention",
    "intra_attention_twin",
    "kernel_unavailable_reason",
    "merge_states",
    "pooled_head_scores",
    "reduce_colsum_to_kv_heads",
    "stats_dtype",
    "units_scope",
]
