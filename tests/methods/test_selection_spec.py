"""Production selection (core/methods/selection.py) against the reference's independent spec of it
(core/reference/specprefill.py): the same kept tokens, positions and chunk scores over many configs."""

import dataclasses

import numpy as np
import pytest

from specfill.core import SpecPrefillConfig
from specfill.core.methods import selection
from specfill.core.reference import specprefill as spec

CONFIGS = [
    SpecPrefillConfig(select_chunk=4),
    SpecPrefillConfig(select_chunk=8, keep_ratio=0.3, neighbours=1, force_keep_last=False),
    SpecPrefillConfig(select_chunk=4, keep_mass=0.5, mass_floor=0.05, mass_ceiling=0.6),
    SpecPrefillConfig(select_chunk=5, keep_tokens=12, keep_first=3, keep_last=2, protected=((7, 11), (40, 44))),
    SpecPrefillConfig(select_chunk=4, keep_mass=0.9, neighbours=2, keep_first=6),
    SpecPrefillConfig(select_chunk=8, keep_ratio=0.2, neighbours=0.5, force_keep_last=False),  # a fraction
    SpecPrefillConfig(select_chunk=5, keep_tokens=10, neighbours=1.3),  # ceil(6.5): 7 tokens each side
]


def disagreements(config: SpecPrefillConfig) -> list[tuple[int, int]]:
    """(prompt length, reused prefix) where production's selection is not the spec's."""
    rng = np.random.default_rng(3)
    found = []
    for n in (1, 3, 17, 64, 101):
        for importance in (rng.uniform(size=n), np.full(n, 0.1), np.zeros(n), rng.uniform(size=n).astype(np.float32)):
            for reused in sorted({0, n // 3, n - 1}):
                want = spec.select_new_tokens(importance, reused, config)
                got = selection.select_new_tokens(importance, reused, config)
                same = got.kept.tolist() == want.kept.tolist() and got.position_ids.tolist() == want.kept.tolist()
                same = same and got.decode_start == want.decode_start == n
                if not (same and np.array_equal(got.chunk_scores, want.chunk_scores)):
                    found.append((n, reused))
    return found


@pytest.mark.parametrize("config", CONFIGS)
def test_production_selection_is_the_spec(config):
    assert not disagreements(config)


def test_a_planted_bug_in_production_selection_is_caught(monkeypatch):
    """Neighbour chunks dropped in production: the comparison above fails."""
    around = selection.around_chunks
    dropped = lambda chosen, n, c: around(chosen, n, dataclasses.replace(c, neighbours=0))  # noqa: E731
    monkeypatch.setattr(selection, "around_chunks", dropped)
    assert disagreements(CONFIGS[1])


def test_a_planted_bug_in_fractional_neighbours_is_caught(monkeypatch):
    """A fraction's reach rounded down in production (ceil(0.5 x 5) = 3, not 2): caught."""
    config = SpecPrefillConfig(select_chunk=5, keep_tokens=10, neighbours=0.5)
    assert not disagreements(config)
    around = selection.around_chunks
    floored = lambda chosen, n, c: around(chosen, n, dataclasses.replace(c, neighbours=0.4))  # noqa: E731
    monkeypatch.setattr(selection, "around_chunks", floored)
    assert disagreements(config)
