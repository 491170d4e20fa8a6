"""The executable spec: a NumPy reference of every stage of both methods."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Sequence

import numpy as np

from ..h2o_walk import h2o_attention_layer
from ..ops import staged_layer_scores
from . import attention, h2o, oracle, specprefill


class ReferenceStages:
    """Both methods' stages, implemented by the NumPy reference functions: the `H2OOps` and
    `ScoringOps` protocols (core/ops.py) on NumPy arrays, plus the conformance boundary.

    The stages are the reference functions themselves (their signatures are the protocol's:
    core/stages.py); `attention_layer` runs the one walk of core/h2o_walk.py over `self`, so a
    subclass that changes one stage (a planted bug) changes the whole layer.
    """

    # the H2O stages (core/stages.H2OStageOps), in the protocol's order
    intra_attention = staticmethod(h2o.intra_attention)
    reduce_colsum_to_kv_heads = staticmethod(h2o.reduce_colsum_to_kv_heads)
    accumulate_scores = staticmethod(h2o.accumulate_scores)
    build_memory_set = staticmethod(h2o.build_memory_set)
    gather_memory = staticmethod(h2o.gather_memory)
    inter_attention = staticmethod(h2o.inter_attention)
    merge_states = staticmethod(attention.merge_states)
    add_sinks = staticmethod(attention.add_sinks)

    # the walk over them (core/ops.H2OOps' other ops, then the whole layer)
    def causal_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
        return h2o.causal_attention(q, k, v, scale).o

    def concat(self, arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(arrays, axis=axis)

    def zero_scores(self, n_kv_heads: int, n_tokens: int, like: np.ndarray) -> np.ndarray:
        return np.zeros((n_kv_heads, n_tokens), attention.accumulation_dtype(like))

    def cast_like(self, x: np.ndarray, like: np.ndarray) -> np.ndarray:
        return x  # the reference keeps its accumulation dtype (float64 or float32)

    def stage_scope(self, like: np.ndarray) -> nullcontext:
        return nullcontext()

    attention_layer = h2o_attention_layer  # the walk with `self` as its ops

    # SpecPrefill's stages (core/stages.ScoringStageOps, SpecPrefillStages) and reduction
    attention_scores = staticmethod(specprefill.attention_scores)
    smooth_scores = staticmethod(specprefill.smooth_scores)
    reduce_axis = staticmethod(specprefill.reduce_axis)
    layer_scores = staged_layer_scores  # the three stages above, one after the other
    spread = staticmethod(specprefill.spread)
    reduce_scores = staticmethod(specprefill.reduce_scores)
    select_tokens = staticmethod(specprefill.select_tokens)


REFERENCE = ReferenceStages()

__all__ = ["REFERENCE", "ReferenceStages", "attention", "h2o", "oracle", "specprefill"]
