"""The one set of stage types, for the NumPy reference and every backend.

Generic over a backend's array type A (np.ndarray for the NumPy reference, torch.Tensor,
mx.array); the ops protocol the methods are written against is in core/ops.py. Shapes use:
  Hq query heads, Hkv KV heads (Hq = G * Hkv, query head h reads KV head h // G),
  T query tokens, N prompt tokens, D head dim, M memory size (L + H),
  (latent attention's values have their own head dim Dv < D: every `o` and output below is [.., Dv];
  queries and keys share D; nothing else depends on Dv),
  n_q scoring queries (last prompt token + look-ahead), n_l scoring layers, P prompt length.
Softmax statistics are float32 at least (float64 when the inputs are float64).
The stages themselves are declared once, below (`H2OStageOps`, `ScoringStageOps`); core/ops.py
builds the ops protocol on them, and the conformance suite talks to a backend through the same
stages with NumPy in and out (`H2OStages` / `SpecPrefillStages`, which the conformance adapters
forward to the stages: conformance/forwarding.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from .config import H2OConfig, SpecPrefillConfig


class Array(Protocol):
    """What the walk reads of a backend's array itself (the rest goes through the ops)."""

    @property
    def shape(self) -> Any: ...


A = TypeVar("A", bound=Array)  # a backend's array type


@dataclass(frozen=True)
class AttentionState(Generic[A]):
    """Online-softmax state of attention over one key block, per query and query head.

    m: [Hq, T] max scaled logit over the block's keys (-inf when the block is empty).
    l: [Hq, T] sum_j exp(s_j - m) (0 when empty).
    o: [Hq, T, D] the block's normalised output sum_j exp(s_j - m) v_j / l (0 when empty).
    Two states over disjoint key blocks merge exactly (see `merge_states`).
    """

    m: A
    l: A
    o: A

    def rows(self, start: int, stop: int) -> AttentionState[A]:
        """The state of query tokens [start, stop)."""
        return AttentionState(self.m[:, start:stop], self.l[:, start:stop], self.o[:, start:stop])


@dataclass(frozen=True)
class KeyWindow(Generic[A]):
    """A sliding window on attention to keys that are not the queries' own (phase 2's memory set,
    the dense tail's prefix): query row t, at position query_start + t, sees key slot s of KV
    head g iff 0 <= query_start + t - position(g, s) < size (core/models.py's convention).

    key_positions: [Hkv, M] int positions of gathered keys (a memory set's indices), or None when
    the keys are the consecutive positions key_start, key_start + 1, ... (a prefix of the prompt).
    A query row whose window holds no key gets the empty state (m = -inf, l = 0, o = 0).
    """

    size: int
    query_start: int
    key_positions: A | None = None
    key_start: int = 0


@dataclass(frozen=True, eq=False)
class AttentionTerms(Generic[A]):
    """Terms a layer adds to its softmax besides q.k (None: the term is absent), carried per layer
    like its sliding window (ModelArgs / AdaptedArgs.layer_terms) into every attention stage.

    softcap: logits -> softcap * tanh(logits / softcap), on the SCALED logits (scale * q.k), before
    any mask (gemma2's attn_logit_softcapping, transformers' eager_attention_forward order).
    sinks: [Hq] one learned logit per query head that joins every softmax's denominator and
    carries no value (gpt_oss: a column of logits appended, the softmax taken, the column
    dropped): p_j = exp(s_j) / (sum_k exp(s_k) + exp(sink_h)); in the backend's array type,
    any float dtype (the stages read it in the statistics dtype). It is not capped.
    eq=False: an array field does not compare; identity is enough (one object per layer).
    """

    sinks: A | None = None
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.softcap is not None and not float(self.softcap) > 0:
            raise ValueError(f"a logit soft-cap must be positive, got {self.softcap!r}")


def active_terms(terms: AttentionTerms[A] | None) -> AttentionTerms[A] | None:
    """`terms` when it holds a term, else None: the stages and the walk test one value, and a layer
    without terms takes exactly today's path."""
    return terms if terms is not None and (terms.sinks is not None or terms.softcap is not None) else None


class LayerArgs(Protocol):
    """What the methods read of a model's layers: core/models.ModelArgs and core/adapted.AdaptedArgs
    declare both (the own families: every layer has keys and no terms)."""

    @property
    def attention_layers(self) -> tuple[int, ...]: ...

    @property
    def layer_terms(self) -> tuple[AttentionTerms[Any] | None, ...]: ...


def layer_terms(args: LayerArgs) -> tuple[AttentionTerms | None, ...]:
    """A model's per-layer attention terms (like its `layer_windows`)."""
    return tuple(args.layer_terms)


def attention_layers(args: LayerArgs) -> tuple[int, ...]:
    """The layers with keys, which the methods run (every layer but a hybrid's recurrent ones)."""
    return tuple(args.attention_layers)


def sinks_of(terms: AttentionTerms[A] | None) -> A | None:
    return None if terms is None else terms.sinks


def softcap_of(terms: AttentionTerms[A] | None) -> float | None:
    return None if terms is None or terms.softcap is None else float(terms.softcap)


def window_binds(window: int | None, max_distance: int) -> bool:
    """Whether a window w can hide a key from a query at most `max_distance` positions after it
    (host integers only: the methods decide this without reading device arrays)."""
    return window is not None and max_distance >= window


def query_start(n_keys: int, n_window: int) -> int | None:
    """The position of the first SpecPrefill scoring query when the first n_window of them are the
    prompt's last tokens' (an observation window over n_keys prompt keys): None for the paper's
    single last-token query (position P - 1: nothing to mask causally)."""
    return None if n_window <= 1 else n_keys - n_window


@dataclass(frozen=True)
class IntraResult(Generic[A]):
    """Phase 1: block-diagonal causal attention of every chunk at once.

    state: AttentionState over keys [chunk_start(i), i] for each query i.
    colsum: [Hq, T] per key j, sum over the queries of j's chunk of softmax_intra(i, j)
    (intra-only normalisation: phase 1 runs before the memory sets exist); None when not asked for
    (the stage's with_colsum).
    """

    state: AttentionState[A]
    colsum: A | None


@dataclass(frozen=True)
class InterResult(Generic[A]):
    """Phase 2: attention of one chunk's queries to the previous memory set (no mask).

    state: AttentionState over the M gathered keys.
    colsum: [Hq, M] per memory slot, sum over the chunk's queries of softmax_inter(i, slot); None
    when not asked for (the stage's with_colsum).
    """

    state: AttentionState[A]
    colsum: A | None


@dataclass(frozen=True)
class MemorySet(Generic[A]):
    """Memory set M_c built after chunk c, per KV head.

    indices: [Hkv, M] int64 prompt positions, ascending in each row, unique, all < chunk_end.
    Row g = tail-L local window of chunk c plus the top-H of (M_{c-1} U C_c) minus local,
    ranked by the KV head's accumulated score, ties to the lower position.
    """

    indices: A
    chunk_index: int

    @property
    def size(self) -> int:
        return int(self.indices.shape[1])


@dataclass
class H2OCarry(Generic[A]):
    """State carried across logical batches of one layer (prompt longer than B).

    scores: [Hkv, n_done] accumulated score per processed prompt position.
    memory: the memory set the next chunk attends to (None before chunk 0 is done).
    memory_sets: every memory set built so far, in chunk order (for reports and tests).
    """

    scores: A
    memory: MemorySet[A] | None = None
    memory_sets: list[MemorySet[A]] = field(default_factory=list)

    @property
    def n_done(self) -> int:
        return int(self.scores.shape[1])


@dataclass(frozen=True)
class H2OLayerResult(Generic[A]):
    """One layer's H2O prefill attention over a whole prompt.

    output: [Hq, N, D] attention output for every prompt position.
    scores: [Hkv, N] final accumulated scores.
    memory_sets: M_0 .. M_{k-2} (none is built after the final chunk).
    """

    output: A
    scores: A
    memory_sets: list[MemorySet[A]]


@dataclass(frozen=True)
class TokenScores(Generic[A]):
    """Speculative-prefill token importance.

    probs: [n_q, n_l, Hq, P] softmax of each scoring query over the prompt keys.
    smoothed: same shape, after average pooling along P.
    importance: [P] max over heads and layers, mean over the scoring queries.
    """

    probs: A
    smoothed: A
    importance: A


@dataclass(frozen=True)
class Selection:
    """Which prompt tokens the main model prefills, and where decoding resumes.

    kept: [K] ascending prompt positions (always includes P - 1 when force_keep_last).
    position_ids: [K] RoPE positions of the kept tokens: their ORIGINAL positions.
    decode_start: position id of the first generated token (= original prompt length P).
    chunk_scores: [n_chunks] mean smoothed importance per selection chunk.
    """

    kept: np.ndarray
    position_ids: np.ndarray
    decode_start: int
    chunk_scores: np.ndarray


def stage_names(*protocols: type) -> tuple[str, ...]:
    """The stages `protocols` declare, their bases' included, in declaration order: what an
    implementation gives and what the conformance adapters forward (conformance/forwarding.py)."""
    names: dict[str, None] = {}
    for protocol in protocols:
        for klass in reversed(protocol.__mro__):
            if vars(klass).get("_is_protocol") and klass is not Protocol and klass is not Generic:
                names.update((n, None) for n, v in vars(klass).items() if callable(v) and not n.startswith("_"))
    return tuple(names)


class H2OStageOps(Protocol[A]):
    """The H2O stages, each checked on its own by the conformance suite: declared here once for the
    NumPy reference (core/reference), each backend's kernels or their twins (core/ops.KernelStages)
    and the conformance boundary (`H2OStages`: A = np.ndarray). The walk (core/h2o_walk.py) needs
    a few more ops besides (core/ops.H2OOps)."""

    def intra_attention(
        self,
        q: A,
        k: A,
        v: A,
        chunk_size: int,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms[A] | None = None,
        with_colsum: bool = True,
    ) -> IntraResult[A]:
        """q [Hq, T, D], k/v [Hkv, T, D]; chunks start at token 0 of the block; window w: query
        i sees only keys j > i - w of its chunk (a sliding layer). terms: the layer's soft-cap
        caps the logits, its sinks join the column sums' denominators; the state stays sink-free
        (the walk folds the sink in once: `add_sinks`). with_colsum False: no column sums are made
        (colsum None), for a caller that reads the state only (the dense tail)."""

    def reduce_colsum_to_kv_heads(self, colsum: A, n_kv_heads: int) -> A:
        """[Hq, X] -> [Hkv, X]: sum of the query heads sharing each KV head."""

    def accumulate_scores(self, scores: A, memory: MemorySet[A], kv_colsum: A) -> A:
        """scores [Hkv, n] with scores[g, memory[g, s]] += kv_colsum[g, s]; returns a new array."""

    def build_memory_set(
        self,
        scores: A,
        previous: MemorySet[A] | None,
        chunk_index: int,
        chunk_start: int,
        chunk_end: int,
        local: int,
        heavy: int,
    ) -> MemorySet[A]:
        """M_c from scores [Hkv, >= chunk_end] and M_{c-1} (None for chunk 0)."""

    def gather_memory(self, k: A, v: A, memory: MemorySet[A]) -> tuple[A, A]:
        """k/v [Hkv, n, D] -> k_mem/v_mem [Hkv, M, D] (row g gathers memory[g])."""

    def inter_attention(
        self,
        q: A,
        k_mem: A,
        v_mem: A,
        scale: float,
        window: KeyWindow[A] | None = None,
        terms: AttentionTerms[A] | None = None,
        with_colsum: bool = True,
    ) -> InterResult[A]:
        """q [Hq, T, D] against k_mem/v_mem [Hkv, M, D], no mask but the window's; terms and
        with_colsum as in intra_attention."""

    def merge_states(self, a: AttentionState[A], b: AttentionState[A]) -> AttentionState[A]:
        """Exact online-softmax merge of two states over disjoint key sets."""

    def add_sinks(self, state: AttentionState[A], sinks: A) -> AttentionState[A]:
        """The state over a query's whole key set with each head's sink logit (sinks [Hq]) in its
        denominator (exp(sink - m) joins l, no value joins o); rows over no key stay finite."""


class ScoringStageOps(Protocol[A]):
    """The speculative-prefill scoring stages, each checked on its own, declared once as
    `H2OStageOps` is (the methods' reductions besides: core/ops.ScoringOps)."""

    def attention_scores(
        self,
        queries: A,
        keys: A,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms[A] | None = None,
        query_start: int | None = None,
    ) -> A:
        """queries [n_l, n_q, Hq, D] (query n at position query_start + n; None: P - 1 + n), keys
        [n_l, Hkv, P, D] -> probs [n_q, n_l, Hq, P]; query n sees keys j <= its position and, with
        a window w, j > its position - w (core/reference/specprefill.scoring_mask; a row that sees
        none is all zeros); terms: the layers' soft-cap caps the logits, their sinks [Hq] join each
        softmax's denominator."""

    def smooth_scores(self, probs: A, kernel: int) -> A:
        """Average pooling along the last axis, zero padding kernel // 2 each side."""


@runtime_checkable
class H2OStages(H2OStageOps[np.ndarray], Protocol):
    """The H2O stages at the conformance boundary (NumPy in, NumPy out; terms' sinks as NumPy [Hq]),
    and the whole layer the walk makes of them."""

    def attention_layer(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        config: H2OConfig,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms | None = None,
        prefix: int = 0,
    ) -> H2OLayerResult:
        """Whole-prompt two-phase attention for one layer (a sliding layer of window w: each key
        set intersected with it; the layer's terms in every softmax): the core walk over this
        backend's ops. prefix P > 0: the walk over a new part after a reused prefix of P keys
        (docs/methods.md, H2O from a reused prefix): q [Hq, N - P, D] the new part's queries, k/v
        [Hkv, N, D] every key."""


@runtime_checkable
class SpecPrefillStages(ScoringStageOps[np.ndarray], Protocol):
    """The speculative-prefill stages at the conformance boundary (NumPy in, NumPy out), with the
    reductions and the selection on the host."""

    def reduce_scores(
        self, probs: np.ndarray, head_reduction: str, layer_reduction: str, lookahead_reduction: str = "mean"
    ) -> np.ndarray:
        """[n_q, n_l, Hq, P] -> [P]: heads, then layers, then the queries (mean or max)."""

    def select_tokens(self, importance: np.ndarray, config: SpecPrefillConfig) -> Selection:
        """Chunk top-k by ceil(n_chunks * keep) or the mass rule, neighbours, force-keep last,
        restore positions."""
