"""The executable spec: a NumPy reference of every stage of both methods."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Sequence

import numpy as np

from ..config import H2OConfig, SpecPrefillConfig
from ..h2o_walk import h2o_attention_layer
from ..stages import (
    AttentionState,
    AttentionTerms,
    H2OLayerResult,
    InterResult,
    IntraResult,
    KeyWindow,
    MemorySet,
    Selection,
)
from . import attention, h2o, oracle, specprefill


class ReferenceStages:
    """Both methods' stages, implemented by the NumPy reference functions: the `H2OOps` and
    `ScoringOps` protocols (core/ops.py) on NumPy arrays, plus the conformance boundary.

    `attention_layer` runs the one walk of core/h2o_walk.py over `self`, so a subclass that
    changes one stage (a planted bug) changes the whole layer.
    """

    def intra_attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        chunk_size: int,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms | None = None,
    ) -> IntraResult:
        return h2o.intra_attention(q, k, v, chunk_size, scale, window, terms)

    def reduce_colsum_to_kv_heads(self, colsum: np.ndarray, n_kv_heads: int) -> np.ndarray:
        return h2o.reduce_colsum_to_kv_heads(colsum, n_kv_heads)

    def accumulate_scores(self, scores: np.ndarray, memory: MemorySet, kv_colsum: np.ndarray) -> np.ndarray:
        return h2o.accumulate_scores(scores, memory, kv_colsum)

    def build_memory_set(
        self,
        scores: np.ndarray,
        previous: MemorySet | None,
        chunk_index: int,
        chunk_start: int,
        chunk_end: int,
        local: int,
        heavy: int,
    ) -> MemorySet:
        return h2o.build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy)

    def gather_memory(self, k: np.ndarray, v: np.ndarray, memory: MemorySet) -> tuple[np.ndarray, np.ndarray]:
        return h2o.gather_memory(k, v, memory)

    def inter_attention(
        self,
        q: np.ndarray,
        k_mem: np.ndarray,
        v_mem: np.ndarray,
        scale: float,
        window: KeyWindow | None = None,
        terms: AttentionTerms | None = None,
    ) -> InterResult:
        return h2o.inter_attention(q, k_mem, v_mem, scale, window, terms)

    def merge_states(self, a: AttentionState, b: AttentionState) -> AttentionState:
        return attention.merge_states(a, b)

    def add_sinks(self, state: AttentionState, sinks: np.ndarray) -> AttentionState:
        return attention.add_sinks(state, sinks)

    def attention_layer(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        config: H2OConfig,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms | None = None,
    ) -> H2OLayerResult:
        return h2o_attention_layer(self, q, k, v, config, scale, window, terms)

    def attention_layer_from_prefix(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        prefix: int,
        config: H2OConfig,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms | None = None,
    ) -> H2OLayerResult:
        return h2o_attention_layer(self, q, k, v, config, scale, window, terms, prefix)

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

    def reduce_axis(self, x: np.ndarray, how: str, axis: int) -> np.ndarray:
        return specprefill.reduce_axis(x, how, axis)

    def attention_scores(
        self,
        queries: np.ndarray,
        keys: np.ndarray,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms | None = None,
        query_start: int | None = None,
    ) -> np.ndarray:
        return specprefill.attention_scores(queries, keys, scale, window, terms, query_start)

    def smooth_scores(self, probs: np.ndarray, kernel: int) -> np.ndarray:
        return specprefill.smooth_scores(probs, kernel)

    def reduce_scores(
        self, probs: np.ndarray, head_reduction: str, layer_reduction: str, lookahead_reduction: str = "mean"
    ) -> np.ndarray:
        return specprefill.reduce_scores(probs, head_reduction, layer_reduction, lookahead_reduction)

    def select_tokens(self, importance: np.ndarray, config: SpecPrefillConfig) -> Selection:
        return specprefill.select_tokens(importance, config)


REFERENCE = ReferenceStages()

__all__ = ["REFERENCE", "ReferenceStages", "attention", "h2o", "oracle", "specprefill"]
