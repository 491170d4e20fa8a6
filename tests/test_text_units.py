"""SpecPrefill's text units (select_units "text", issue 47 item 3): the segmenter's rule
(core/text_units.py), the production selection equal to the spec's (core/reference/specprefill.py)
over random units and importances, and the config's checks."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core import ConfigError, SpecPrefillConfig
from specfill.core.methods.selection import select_new_tokens, select_tokens
from specfill.core.reference import specprefill
from specfill.core.text_units import text_unit_starts, token_pieces, with_text_units_config

PIECES = ["Doc", " 1", ":\n", "The", " cat", " sat", ".\n\n", "Doc", " 2", ":\n", "x"] + [" y"] * 10
PIECES += ["\n", "\n", "def", " f", "():\n", "    ", "return", "\n"]


def test_paragraphs_lines_and_long_lines():
    # doc 1 (7 tokens) is one unit; doc 2's long line (12 tokens) starts its own unit and is cut
    # after 8; the blank line closes the paragraph; the code block is one unit
    assert text_unit_starts(PIECES, 8) == (0, 7, 10, 18, 23)
    # room for whole paragraphs: one unit each
    assert text_unit_starts(PIECES, 100) == (0, 7, 23)
    # lines of a long paragraph packed whole: "Doc 2:\n" (3) + the 12-token line does not fit 14
    assert text_unit_starts(PIECES, 14) == (0, 7, 10, 23)


def test_edges():
    assert text_unit_starts([], 4) == ()
    assert text_unit_starts(["a", "b", "c"], 2) == (0, 2)  # no line break: one line cut every 2
    assert text_unit_starts(["\n", "\n", "a"], 4) == (0, 1, 2)  # blank lines are paragraphs
    with pytest.raises(ValueError, match="at least one token"):
        text_unit_starts(["a"], 0)


class _Decoder:
    def __init__(self, texts: dict[int, str]):
        self.texts, self.calls = texts, 0

    def decode(self, ids):
        self.calls += 1
        return "".join(self.texts[i] for i in ids)


def test_pieces_decode_each_id_once_and_fill_the_config():
    tok = _Decoder({1: "a", 2: " b", 3: ".\n\n"})
    ids = [1, 2, 3, 1, 2, 2, 3, 1]
    assert token_pieces(tok, ids) == ["a", " b", ".\n\n", "a", " b", " b", ".\n\n", "a"]
    assert tok.calls == 3
    config = with_text_units_config(SpecPrefillConfig(select_units="text", select_chunk=2), tok, ids)
    assert config.unit_starts == (0, 2, 3, 5, 7)  # units of at most select_chunk = 2 tokens, cut at paragraphs
    chunks = SpecPrefillConfig()
    assert with_text_units_config(chunks, tok, ids) is chunks  # chunks: nothing to fill


def _random_units(rng, n):
    cuts = rng.choice(np.arange(1, n), size=int(rng.integers(0, min(n - 1, 30) + 1)), replace=False)
    return tuple(sorted({0, *map(int, cuts)}))


@pytest.mark.parametrize("seed", range(40))
def test_production_selects_what_the_spec_selects(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    importance = rng.random(n) ** 3
    if seed % 4 == 0:  # ties: equal means rank the earlier unit first
        importance = np.round(importance, 1)
    keep = (
        {"keep_tokens": int(rng.integers(1, n + 20))} if seed % 3 == 0 else {"keep_ratio": float(rng.random()) or 1.0}
    )
    config = SpecPrefillConfig(
        select_units="text",
        unit_starts=_random_units(rng, n) if n > 1 else (0,),
        neighbours=int(rng.integers(0, 2)),
        token_floor=int(rng.integers(0, 40)),
        keep_first=int(rng.integers(0, 5)),
        keep_last=int(rng.integers(0, 5)),
        **keep,
    )
    got, spec = select_tokens(importance, config), specprefill.select_tokens(importance, config)
    assert got.kept.tolist() == spec.kept.tolist()
    np.testing.assert_allclose(got.chunk_scores, spec.chunk_scores, rtol=1e-12)
    assert len(got.kept) <= specprefill.keep_count_upper_bound(n, config)
    reused = int(rng.integers(0, n))
    new = select_new_tokens(importance, reused, config)
    assert new.kept.tolist() == specprefill.select_new_tokens(importance, reused, config).kept.tolist()


def test_whole_units_until_the_budget():
    """Units are kept whole, best first, until they hold the budget: the unit that reaches it is kept,
    the next best is not."""
    starts = (0, 10, 14, 40, 41, 70)
    importance = np.zeros(100)
    for start, value in zip(starts, (0.1, 0.9, 0.5, 0.8, 0.7, 0.2)):
        importance[start:] = value
    config = SpecPrefillConfig(select_units="text", unit_starts=starts, keep_ratio=0.3, force_keep_last=False)
    # ranked: [10,14) 0.9 (4 tokens), [40,41) 0.8 (1), [41,70) 0.7 (29: reaches 30) -> stop
    assert select_tokens(importance, config).kept.tolist() == [*range(10, 14), *range(40, 70)]
    neighbours = SpecPrefillConfig(select_units="text", unit_starts=starts, keep_tokens=4, neighbours=1)
    assert select_tokens(importance, neighbours).kept.tolist() == [*range(0, 40), 99]


def test_reused_prefix_moves_the_units():
    config = SpecPrefillConfig(select_units="text", unit_starts=(0, 10, 25, 40), keep_first=12)
    moved = config.for_new_part(20)
    assert moved.unit_starts == (0, 5, 20) and moved.keep_first == 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"select_units": "words"}, "select_units"),
        ({"unit_starts": (0, 5)}, "unit_starts"),  # starts without text units
        ({"select_units": "text", "unit_starts": (0, -1)}, "unit_starts"),
        ({"select_units": "text", "unit_starts": (0, True)}, "unit_starts"),
        ({"select_units": "text", "keep_mass": 0.5}, "keep_mass"),
    ],
)
def test_bad_settings_name_their_field(fields, field):
    with pytest.raises(ConfigError) as err:
        SpecPrefillConfig(**fields)
    assert err.value.fields[0] == field


def test_text_units_unfilled_is_one_clear_error():
    config = SpecPrefillConfig(select_units="text")
    for select in (select_tokens, specprefill.select_tokens):
        with pytest.raises(ConfigError, match="unit_starts"):
            select(np.ones(10), config)


def test_starts_are_sorted_unique_from_zero():
    assert SpecPrefillConfig(select_units="text", unit_starts=(9, 3, 3)).unit_starts == (0, 3, 9)
