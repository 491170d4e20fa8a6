"""Each planted bug, in a copy of the reference adapter, must make conformance checks fail."""

import dataclasses

import numpy as np
import pytest

from specfill.conformance import ReferenceAdapter, run_conformance
from specfill.conformance.ops_adapter import CacheAdapter
from specfill.core import AttentionState, MemorySet
from specfill.core.reference import attention, h2o, specprefill
from specfill.core.reference.kv_cache import ReferenceKVCache
from specfill.core.stages import AttentionTerms


class LocalWindowOffByOne(ReferenceAdapter):
    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy):
        good = super().build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy)
        if local == 0:
            return good
        shifted = super().build_memory_set(
            scores, previous, chunk_index, chunk_start, chunk_end - 1, local, heavy + 1
        )  # window ends one token early
        return MemorySet(shifted.indices[:, : good.size], chunk_index)


class WrongGqaMapping(ReferenceAdapter):
    """Query head h reads KV head h % Hkv instead of h // G."""

    @staticmethod
    def _tile(x, n_heads, axis=0):
        return np.concatenate([x] * (n_heads // x.shape[axis]), axis=axis)

    def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True):
        n = q.shape[0]
        return super().intra_attention(q, self._tile(k, n), self._tile(v, n), chunk_size, scale, window, terms)

    def inter_attention(self, q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True):
        n = q.shape[0]
        if window is not None and window.key_positions is not None:
            window = dataclasses.replace(window, key_positions=self._tile(window.key_positions, n))
        return super().inter_attention(q, self._tile(k_mem, n), self._tile(v_mem, n), scale, window, terms)

    def reduce_colsum_to_kv_heads(self, colsum, n_kv_heads):
        if colsum.shape[0] != n_kv_heads:  # colsum came back per query head: fold h % Hkv
            return colsum.reshape(-1, n_kv_heads, *colsum.shape[1:]).sum(axis=0)
        return colsum

    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None):
        return super().attention_scores(
            queries, self._tile(keys, queries.shape[2], axis=1), scale, window, terms, query_start
        )


class MergeWithoutRescaling(ReferenceAdapter):
    def merge_states(self, a, b):
        l = a.l + b.l
        o = (a.l[..., None] * a.o + b.l[..., None] * b.o) / np.where(l > 0, l, 1.0)[..., None]
        return AttentionState(np.maximum(a.m, b.m), l, o)


class PositionsNotRestored(ReferenceAdapter):
    def select_tokens(self, importance, config):
        good = super().select_tokens(importance, config)
        n = len(good.kept)
        return specprefill.Selection(good.kept, np.arange(n), n, good.chunk_scores)


class ChunkGridFromTheEnd(ReferenceAdapter):
    """Selection chunks laid from the prompt's end instead of its start (the grid a selection over a
    new part must not shift): the chunk means differ wherever the length is not a multiple."""

    def select_tokens(self, importance, config):
        pad = -len(importance) % config.select_chunk
        good = super().select_tokens(np.r_[np.zeros(pad), importance], config)
        kept = good.kept[good.kept >= pad] - pad
        return specprefill.Selection(kept, kept.copy(), len(importance), good.chunk_scores)


class DenseTailOffByOne(ReferenceAdapter):
    """The dense tail starts one query late: row N - W keeps its sparse key set."""

    def attention_layer(self, q, k, v, config, scale, window=None, terms=None, prefix=0):
        short = dataclasses.replace(config, dense_tail=max(0, config.dense_tail - 1))
        return super().attention_layer(q, k, v, short, scale, window, terms, prefix)


class PrefixCutToItsSecondHalf(ReferenceAdapter):
    """From a reused prefix, the first memory set holds the prefix's second half only (the first
    new chunk misses keys the spec gives it: the whole prefix)."""

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy):
        if chunk_index == -1:  # the walk's M_(-1): the prefix [0, chunk_end)
            local = max(1, chunk_end // 2)
        return super().build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy)


class PrefixNeverHeavy(ReferenceAdapter):
    """Prefix tokens are never heavy hitters: M_0 is chosen from the first new chunk alone."""

    def build_memory_set(self, scores, previous, chunk_index, chunk_start, chunk_end, local, heavy):
        if previous is not None and previous.chunk_index == -1:
            previous = None
        return super().build_memory_set(scores, previous, chunk_index, chunk_start, chunk_end, local, heavy)


class PrefixVotesDropped(ReferenceAdapter):
    """The first new chunk's votes for the prefix are not added to the scores."""

    def accumulate_scores(self, scores, memory, kv_colsum):
        return scores if memory.chunk_index == -1 else super().accumulate_scores(scores, memory, kv_colsum)


class PrefixGridFromZero(ReferenceAdapter):
    """The new part's chunks on the whole prompt's grid (multiples of S) instead of from P: the
    walk is handed a prompt whose first new chunk is a sliver (emulated: the prefix rounded down
    to the grid, the rest walked as new)."""

    def attention_layer(self, q, k, v, config, scale, window=None, terms=None, prefix=0):
        aligned = prefix // config.chunk_size * config.chunk_size
        if aligned == prefix:
            return super().attention_layer(q, k, v, config, scale, window, terms, prefix)
        q_all = np.concatenate([np.zeros((q.shape[0], prefix - aligned, q.shape[2])), q], axis=1)
        got = super().attention_layer(q_all, k, v, config, scale, window, terms, aligned)
        return dataclasses.replace(got, output=got.output[:, prefix - aligned :])


class SlidingWindowOffByOne(ReferenceAdapter):
    """A sliding layer's window one key too wide (j >= i - w instead of j > i - w), in every
    stage that takes one."""

    def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True):
        return super().intra_attention(q, k, v, chunk_size, scale, None if window is None else window + 1, terms)

    def inter_attention(self, q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True):
        wider = None if window is None else dataclasses.replace(window, size=window.size + 1)
        return super().inter_attention(q, k_mem, v_mem, scale, wider, terms)

    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None):
        return super().attention_scores(
            queries, keys, scale, None if window is None else window + 1, terms, query_start
        )


class SinkInEveryState(ReferenceAdapter):
    """The sink folded into phase 1's and phase 2's states before they merge (counted twice for
    a query that has both), instead of once into the merged state."""

    def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True):
        got = super().intra_attention(q, k, v, chunk_size, scale, window, terms)
        if terms is None or terms.sinks is None:
            return got
        return h2o.IntraResult(attention.add_sinks(got.state, terms.sinks), got.colsum)

    def inter_attention(self, q, k_mem, v_mem, scale, window=None, terms=None, with_colsum=True):
        got = super().inter_attention(q, k_mem, v_mem, scale, window, terms)
        if terms is None or terms.sinks is None or k_mem.shape[1] == 0:
            return got
        return h2o.InterResult(attention.add_sinks(got.state, terms.sinks), got.colsum)

    def add_sinks(self, state, sinks):
        return state  # already in (the bug)


class SinkLeftOutOfScores(ReferenceAdapter):
    """The column sums and SpecPrefill's scores normalised without the sink (the outputs keep it)."""

    @staticmethod
    def _no_sinks(terms):
        return None if terms is None or terms.softcap is None else AttentionTerms(None, terms.softcap)

    def intra_attention(self, q, k, v, chunk_size, scale, window=None, terms=None, with_colsum=True):
        got = super().intra_attention(q, k, v, chunk_size, scale, window, terms)
        return h2o.IntraResult(
            got.state, super().intra_attention(q, k, v, chunk_size, scale, window, self._no_sinks(terms)).colsum
        )

    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None):
        return super().attention_scores(queries, keys, scale, window, self._no_sinks(terms), query_start)


class SoftcapAfterTheMask(ReferenceAdapter):
    """The soft-cap applied to masked logits too (tanh(-inf) = -1: hidden keys get weight)."""

    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None):
        if terms is None or terms.softcap is None or window is None:
            return super().attention_scores(queries, keys, scale, window, terms, query_start)
        cap = terms.softcap
        logits = np.einsum("lqhd,lhpd->qlhp", queries, np.repeat(keys, queries.shape[2] // keys.shape[1], axis=1))
        visible = specprefill.scoring_mask(queries.shape[1], keys.shape[2], window, query_start)[:, None, None, :]
        capped = np.tanh(np.where(visible, logits * scale, -np.inf) / cap) * cap
        sinks = None if terms.sinks is None else np.asarray(terms.sinks)
        return attention.masked_state(capped, np.bool_(True), np.zeros((keys.shape[2], 0)), sinks)[1]


class QueryWindowSeesTheFuture(ReferenceAdapter):
    """An observation window's queries score every prompt key (query_start dropped: no causal mask)."""

    def attention_scores(self, queries, keys, scale, window=None, terms=None, query_start=None):
        return super().attention_scores(queries, keys, scale, window, terms)


class LayerAttendsToEveryKey(ReferenceAdapter):
    """attention_layer ignores its memory sets (causal attention over every key): a speculator
    whose "H2O" pass is dense, so the composition's kept positions are plain SpecPrefill's."""

    def attention_layer(self, q, k, v, config, scale, window=None, terms=None, prefix=0):
        dense = dataclasses.replace(config, chunk_size=q.shape[1], batch_size=q.shape[1], local=0, heavy=0)
        return super().attention_layer(q, k, v, dense, scale, window, terms, prefix)


class TrimSparesTheFirstLayers(ReferenceAdapter):
    """A cache whose trim(n, n_layers) ignores n_layers (a "self:K" draft's trim cuts every layer)
    and whose growth keeps one slot too few."""

    class Cache(ReferenceKVCache):
        def trim(self, n, n_layers=None):
            super().trim(n)

        def grown(self, capacity):
            grown = super().grown(capacity)
            grown.trim(1)
            return grown

    def new_cache(self, n_layers, n_kv_heads, head_dim, capacity, value_dim=None):
        good = super().new_cache(n_layers, n_kv_heads, head_dim, capacity, value_dim)
        return CacheAdapter(self.Cache(n_layers, n_kv_heads, head_dim, capacity, self.dtype, value_dim), good.cv)


class ValuesPaddedToTheKeysWidth(ReferenceAdapter):
    """A cache that ignores latent attention's value width: values zero-padded to the keys' and
    handed back so (what an attention over them computes is right, the cache's contract is not)."""

    class Cache(ReferenceKVCache):
        def __init__(self, n_layers, n_kv_heads, head_dim, capacity, dtype=np.float64, value_dim=None):
            super().__init__(n_layers, n_kv_heads, head_dim, capacity, dtype)
            for layer in self.layers:
                store = layer.update_and_fetch
                layer.update_and_fetch = lambda k, v, store=store: store(
                    k, np.pad(v, ((0, 0), (0, 0), (0, 0), (0, k.shape[-1] - v.shape[-1])))
                )

    def new_cache(self, n_layers, n_kv_heads, head_dim, capacity, value_dim=None):
        good = super().new_cache(n_layers, n_kv_heads, head_dim, capacity, value_dim)
        return CacheAdapter(self.Cache(n_layers, n_kv_heads, head_dim, capacity, self.dtype, value_dim), good.cv)


@pytest.mark.parametrize(
    "adapter,must_fail",
    [
        (TrimSparesTheFirstLayers, {"kv_cache.offsets", "kv_cache.filled", "kv_cache.keys"}),
        (ValuesPaddedToTheKeysWidth, {"kv_cache.update_and_fetch.values"}),
        (DenseTailOffByOne, {"h2o.layer.output_vs_key_sets"}),
        (PrefixCutToItsSecondHalf, {"h2o.prefix_layer.output_vs_key_sets", "h2o.prefix_layer.one_chunk_is_full"}),
        (PrefixNeverHeavy, {"h2o.prefix_layer.memory_vs_oracle"}),
        (PrefixVotesDropped, {"h2o.prefix_layer.scores_vs_key_sets", "h2o.prefix_layer.memory_vs_oracle"}),
        (PrefixGridFromZero, {"h2o.prefix_layer.memory_structure", "h2o.prefix_layer.output_vs_key_sets"}),
        (LayerAttendsToEveryKey, {"h2o.layer.output_vs_key_sets", "specprefill.composed.kept"}),
        (
            SlidingWindowOffByOne,
            {
                "h2o.intra_attention.o",
                "h2o.inter_attention.o",
                "h2o.layer.output_vs_key_sets",
                "h2o.layer.scores_vs_key_sets",
                "specprefill.attention_scores",
            },
        ),
        (LocalWindowOffByOne, {"h2o.build_memory_set", "h2o.layer.memory_structure"}),
        (WrongGqaMapping, {"h2o.intra_attention.o", "h2o.inter_attention.o", "specprefill.attention_scores"}),
        (MergeWithoutRescaling, {"h2o.merge_states.o", "h2o.layer.output_vs_key_sets"}),
        (SinkInEveryState, {"h2o.layer.output_vs_key_sets"}),
        (
            SinkLeftOutOfScores,
            {"h2o.intra_attention.colsum", "h2o.layer.scores_vs_key_sets", "specprefill.attention_scores"},
        ),
        (SoftcapAfterTheMask, {"specprefill.attention_scores"}),
        (QueryWindowSeesTheFuture, {"specprefill.attention_scores"}),
        (ChunkGridFromTheEnd, {"specprefill.select_tokens.kept", "specprefill.reuse.kept"}),
        (
            PositionsNotRestored,
            {
                "specprefill.select_tokens.position_ids",
                "specprefill.select_tokens.decode_start",
                "specprefill.selection.invariants",
            },
        ),
    ],
)
def test_planted_bug_is_caught(adapter, must_fail):
    report = run_conformance("planted", ["float64"], make_adapter=adapter)
    failed = {r.check for r in report.failures}
    assert not report.passed
    assert must_fail <= failed, f"missed: {must_fail - failed}"


def test_the_unmodified_copy_passes():
    assert run_conformance("copy", ["float64", "float32"], make_adapter=ReferenceAdapter).passed


def test_local_window_helper_is_the_tail_of_the_chunk():
    assert h2o.local_window(16, 24, 3).tolist() == [21, 22, 23]
    assert h2o.local_window(16, 24, 0).tolist() == []
