"""Speculative-prefill reference: seed 000's worked example and the paper's position rules."""

import math

import numpy as np
import pytest

from specfill.core import SpecPrefillConfig
from specfill.core.errors import ConfigError
from specfill.core.reference import REFERENCE, specprefill


def test_seed_000_toy_example():
    keys = np.array([[[1, 0], [0, 1], [1, 1]], [[1, 2], [0, 2], [2, 2]]], float)[None]
    queries = np.array([[1, 0], [0, 1], [1, 1], [2, 1]], float)[None, None]
    config = SpecPrefillConfig(keep_ratio=0.5, pool_kernel=1, select_chunk=1)
    scores, selection = specprefill.speculative_selection(queries, keys, config, 1 / math.sqrt(2), REFERENCE)
    np.testing.assert_allclose(scores.importance, [0.401, 0.401, 0.768], atol=5e-4)
    assert selection.kept.tolist() == [0, 2]


def test_paper_position_example():
    """Ten prompt tokens, kept [0, 1, 3, 6, 7]: positions restored, decoding starts at 10."""
    selection = specprefill.restore_positions(np.array([0, 1, 3, 6, 7]), 10, np.zeros(10))
    assert selection.position_ids.tolist() == [0, 1, 3, 6, 7]
    assert selection.decode_start == 10


def test_observation_window_queries_see_only_the_keys_at_or_before_them():
    """query_start s: query n sits at position s + n; its probabilities on later keys are 0 and the
    rest are the softmax over the keys it sees; queries from P - 1 on see every key (the paper's)."""
    rng = np.random.default_rng(3)
    queries, keys = rng.normal(size=(2, 7, 4, 8)), rng.normal(size=(2, 2, 20, 8))
    probs = specprefill.attention_scores(queries, keys, 0.3, query_start=15)  # 5 window queries, then 2
    for n in range(7):
        seen = min(20, 15 + n + 1)
        assert np.all(probs[n, ..., seen:] == 0.0)
        np.testing.assert_allclose(probs[n, ..., :seen].sum(-1), 1.0)
        alone = specprefill.attention_scores(queries[:, n : n + 1], keys[:, :, :seen], 0.3)
        np.testing.assert_allclose(probs[n : n + 1, ..., :seen], alone, rtol=1e-12)
    np.testing.assert_array_equal(
        specprefill.attention_scores(queries, keys, 0.3, query_start=19),
        specprefill.attention_scores(queries, keys, 0.3),
    )
    with_window = specprefill.attention_scores(queries, keys, 0.3, window=4, query_start=15)
    assert np.all(with_window[0, ..., :12] == 0.0) and np.all(with_window[0, ..., 16:] == 0.0)


def test_a_reused_prefix_is_never_selected_and_the_new_part_is_selected_as_a_prompt():
    """select_new_tokens (SpecPrefill from a reused prefix): the new part [R, P) is selected as a
    prompt of its own (chunk grid from R), positions shifted by R; keep_first counts from the
    prompt's start; R = 0 is select_tokens."""
    rng = np.random.default_rng(5)
    importance = rng.uniform(size=130)
    importance[:40] = 10.0  # the prefix draws most of the score: still never selected
    config = SpecPrefillConfig(keep_ratio=0.3, select_chunk=8)
    got = specprefill.select_new_tokens(importance, 40, config)
    alone = specprefill.select_tokens(importance[40:], config)
    assert got.kept.tolist() == (alone.kept + 40).tolist() and got.kept.min() >= 40
    assert got.position_ids.tolist() == got.kept.tolist() and got.decode_start == 130
    np.testing.assert_array_equal(
        specprefill.select_new_tokens(importance, 0, config).kept, specprefill.select_tokens(importance, config).kept
    )
    first = specprefill.select_new_tokens(
        importance, 40, SpecPrefillConfig(keep_ratio=0.3, select_chunk=8, keep_first=45)
    )
    assert set(range(40, 45)) <= set(first.kept.tolist())


def test_protected_spans_are_always_kept_on_top_of_the_budget_and_count_from_the_prompt_start():
    importance = np.r_[np.zeros(64), np.ones(64)]  # the second half wins every chunk
    plain = SpecPrefillConfig(keep_ratio=0.25, select_chunk=8)
    spans = SpecPrefillConfig(keep_ratio=0.25, select_chunk=8, protected=((3, 9), (40, 41), (120, 500)))
    base = set(specprefill.select_tokens(importance, plain).kept.tolist())
    got = set(specprefill.select_tokens(importance, spans).kept.tolist())
    assert got == base | set(range(3, 9)) | {40} | set(range(120, 128))
    assert len(got) <= specprefill.keep_count_upper_bound(128, spans)
    reused = specprefill.select_new_tokens(importance, 40, spans)  # (3, 9) lies in the dense prefix
    alone = set((specprefill.select_tokens(importance[40:], plain).kept + 40).tolist())
    assert set(reused.kept.tolist()) == alone | {40} | set(range(120, 128))
    with pytest.raises(ConfigError, match="protected"):
        SpecPrefillConfig(protected=((5, 2),))
    with pytest.raises(ConfigError, match="protected"):
        SpecPrefillConfig(protected=((1.5, 2),))
    assert SpecPrefillConfig(protected=[[1, 2]]).protected == ((1, 2),)
