"""Speculative-prefill reference: seed 000's worked example and the paper's position rules."""
import math

import numpy as np

from specfill.core import SpecPrefillConfig
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
