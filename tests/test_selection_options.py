"""Issue 24's selection options, at the NumPy reference: the importance-mass rule, max over the
look-ahead queries, neighbour chunks, H2O memory as a share of the prompt, and their checks."""

import argparse
import dataclasses
import math

import numpy as np
import pytest

from specfill.cli.options import add_method_options, specprefill_config
from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig
from specfill.core.config import GROWTH_FROM
from specfill.core.methods import selection
from specfill.core.reference import specprefill

MASS = SpecPrefillConfig(keep_mass=0.5, mass_floor=0.05, mass_ceiling=0.5, select_chunk=4, force_keep_last=False)


def test_mass_rule_keeps_more_chunks_for_a_flat_score_than_for_a_peaked_one():
    flat = np.ones(400)
    peaked = np.full(400, 1e-3)
    peaked[200:204] = 10.0  # one chunk holds nearly all the importance (a needle)
    n_flat = len(specprefill.select_tokens(flat, MASS).kept) // 4
    n_peaked = len(specprefill.select_tokens(peaked, MASS).kept) // 4
    assert n_flat == 50  # half the mass of 100 equal chunks
    assert n_peaked == 5  # the floor: ceil(100 * 0.05); the needle's chunk among them
    assert 200 in specprefill.select_tokens(peaked, MASS).kept


def test_mass_rule_is_clamped_to_its_ceiling_and_counts_a_short_last_chunk_by_its_length():
    flat = np.ones(400)
    capped = SpecPrefillConfig(keep_mass=0.9, mass_floor=0.05, mass_ceiling=0.2, select_chunk=4, force_keep_last=False)
    assert len(specprefill.select_tokens(flat, capped).kept) == 20 * 4
    # 3 chunks: [0..3] mean 1, [4..7] mean 1, [8] mean 5 (mass 5 of 13): the best chunk by mean
    # holds 5/13 < 0.5 of the mass, so a second chunk is needed
    importance = np.r_[np.ones(8), 5.0]
    config = SpecPrefillConfig(keep_mass=0.5, mass_floor=0.1, mass_ceiling=1.0, select_chunk=4, force_keep_last=False)
    assert specprefill.select_tokens(importance, config).kept.tolist() == [0, 1, 2, 3, 8]


def test_mass_rule_without_any_importance_keeps_the_floor():
    config = SpecPrefillConfig(keep_mass=0.5, mass_floor=0.1, mass_ceiling=0.5, select_chunk=1, force_keep_last=False)
    assert specprefill.select_tokens(np.zeros(50), config).kept.tolist() == [0, 1, 2, 3, 4]


def _probs() -> np.ndarray:
    """[n_q=3, n_l=1, Hq=1, P=3]: the first query reads position 0 strongly, the look-ahead
    queries read positions 1 and 2 moderately."""
    rows = np.array([[0.9, 0.1, 0.0], [0.0, 0.5, 0.5], [0.0, 0.5, 0.5]])
    return rows[:, None, None, :]


def test_max_over_the_lookahead_keeps_what_one_step_reads_strongly():
    mean = specprefill.reduce_scores(_probs(), "max", "max", "mean")
    top = specprefill.reduce_scores(_probs(), "max", "max", "max")
    np.testing.assert_allclose(mean, [0.3, 11 / 30, 1 / 3])
    np.testing.assert_allclose(top, [0.9, 0.5, 0.5])
    one = dict(keep_tokens=1, select_chunk=1, pool_kernel=1, force_keep_last=False)
    assert specprefill.select_tokens(mean, SpecPrefillConfig(**one)).kept.tolist() == [1]
    assert specprefill.select_tokens(top, SpecPrefillConfig(**one, lookahead_reduction="max")).kept.tolist() == [0]


def test_neighbours_keep_the_chunks_around_each_selected_one_inside_the_prompt():
    importance = np.zeros(40)
    importance[0] = 1.0  # chunk 0: no left neighbour
    importance[21] = 2.0  # chunk 5
    config = SpecPrefillConfig(keep_tokens=8, select_chunk=4, neighbours=1, force_keep_last=False)
    kept = specprefill.select_tokens(importance, config).kept.tolist()
    assert kept == list(range(0, 8)) + list(range(16, 28))
    assert len(kept) <= specprefill.keep_count_upper_bound(40, config)
    plain = SpecPrefillConfig(keep_tokens=8, select_chunk=4, force_keep_last=False)
    assert set(specprefill.select_tokens(importance, plain).kept.tolist()) < set(kept)


def test_a_fraction_of_a_neighbour_keeps_the_nearest_tokens_each_side():
    """neighbours 0.5 with chunks of 4: the 2 tokens either side of each kept chunk, inside the
    prompt; a whole float is the int (one setting, one value)."""
    importance = np.zeros(40)
    importance[0] = 1.0  # chunk 0: nothing on its left
    importance[21] = 2.0  # chunk 5: tokens 18..25 with its neighbours' halves
    config = SpecPrefillConfig(keep_tokens=8, select_chunk=4, neighbours=0.5, force_keep_last=False)
    kept = specprefill.select_tokens(importance, config).kept.tolist()
    assert kept == list(range(0, 6)) + list(range(18, 26))
    assert len(kept) <= specprefill.keep_count_upper_bound(40, config) == 2 * (4 + 2 * 2) + 1
    whole = SpecPrefillConfig(neighbours=1.0)
    assert whole.neighbours == 1 and isinstance(whole.neighbours, int) and whole == SpecPrefillConfig(neighbours=1)


def test_upper_bound_covers_the_mass_ceiling_and_neighbours():
    config = SpecPrefillConfig(keep_mass=0.99, mass_floor=0.1, mass_ceiling=0.3, select_chunk=4, neighbours=2)
    rng = np.random.default_rng(0)
    for _ in range(5):
        kept = specprefill.select_tokens(rng.uniform(size=203), config).kept
        assert len(kept) <= specprefill.keep_count_upper_bound(203, config)
    assert specprefill.keep_count_upper_bound(203, config) == min(203, min(51, math.ceil(51 * 0.3) * 5) * 4 + 1)


@pytest.mark.parametrize(
    "fields",
    [
        {"keep_mass": 0.0},
        {"keep_mass": 1.5},
        {"keep_mass": True},
        {"keep_mass": float("nan")},
        {"keep_mass": 0.5, "keep_tokens": 10},
        {"keep_mass": 0.5, "mass_floor": 0.4, "mass_ceiling": 0.2},
        {"keep_mass": 0.5, "mass_floor": 0.0},
        {"keep_mass": 0.5, "mass_ceiling": 1.2},
        {"neighbours": -1},
        {"neighbours": 0.5, "select_units": "text"},
        {"neighbours": float("inf")},
        {"neighbours": True},
        {"lookahead_reduction": "sum"},
    ],
)
def test_bad_selection_options_are_one_config_error(fields):
    with pytest.raises(ConfigError):
        SpecPrefillConfig(**fields)


def test_the_mass_rule_turns_keep_ratio_off_and_reports_its_chunk_range():
    config = SpecPrefillConfig(keep_mass=0.6, mass_floor=0.1, mass_ceiling=0.25)
    assert config.keep_ratio is None
    assert config.chunk_range(100) == (10, 25) and config.n_kept_chunks(100) == 25
    assert SpecPrefillConfig(keep_ratio=0.3).chunk_range(10) == (3, 3)


def test_keep_mass_is_exclusive_with_the_other_keep_settings_and_with_keep_replaces_it():
    """One check in the config: a mass rule beside a ratio or a budget is an error naming both."""
    for other in ({"keep_ratio": 0.2}, {"keep_tokens": 64}):
        with pytest.raises(ConfigError, match="not both"):
            SpecPrefillConfig(keep_mass=0.5, **other)
    mass = SpecPrefillConfig(lookahead=3).with_keep(mass=0.5)
    assert (mass.keep_ratio, mass.keep_tokens, mass.keep_mass, mass.lookahead) == (None, None, 0.5, 3)
    ratio = mass.with_keep(ratio=0.3)
    assert (ratio.keep_ratio, ratio.keep_mass) == (0.3, None)
    with pytest.raises(ConfigError, match="not both"):
        dataclasses.replace(mass, keep_tokens=64)


def test_cli_keep_and_keep_mass_meet_the_same_check():
    parser = argparse.ArgumentParser()
    add_method_options(parser)
    assert specprefill_config(parser.parse_args([])).keep_ratio == 0.3
    assert specprefill_config(parser.parse_args(["--keep-mass", "0.6"])).keep_mass == 0.6
    with pytest.raises(ConfigError, match="not both"):
        specprefill_config(parser.parse_args(["--keep", "0.2", "--keep-mass", "0.6"]))


def test_memory_share_resolves_per_prompt_in_the_given_proportion_below_the_chunk():
    config = H2OConfig(1024, 4096, 256, 256, memory_share=0.125)
    assert config.for_prompt(4096) == H2OConfig(1024, 4096, 256, 256)
    assert config.for_prompt(2000).memory_size == 250
    clamped = config.for_prompt(16_000)
    assert clamped.memory_size == 1023 and clamped.memory_share is None
    skewed = H2OConfig(1024, 4096, 64, 192, memory_share=0.1).for_prompt(4000)
    assert (skewed.local, skewed.heavy) == (100, 300)
    assert H2OConfig(64, 64, 0, 0, memory_share=0.01).for_prompt(10).memory_size == 1  # at least one slot
    assert H2OConfig(1024, 4096, 256, 256).for_prompt(10) == H2OConfig(1024, 4096, 256, 256)


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1, True, "0.2", float("nan")])
def test_bad_memory_share_is_one_config_error(share):
    with pytest.raises(ConfigError):
        H2OConfig(memory_share=share)


def test_a_token_floor_raises_the_budget_and_edges_are_always_kept():
    rng = np.random.default_rng(1)
    importance = rng.uniform(size=100)
    low = SpecPrefillConfig(keep_ratio=0.1, select_chunk=4, force_keep_last=False)
    assert len(specprefill.select_tokens(importance, low).kept) == 12  # ceil(25 * 0.1) = 3 chunks
    floored = SpecPrefillConfig(keep_ratio=0.1, select_chunk=4, force_keep_last=False, token_floor=30)
    assert len(specprefill.select_tokens(importance, floored).kept) == 32  # ceil(30 / 4) = 8 chunks
    assert floored.chunk_range(25) == (8, 8) and SpecPrefillConfig(token_floor=10_000).chunk_range(25) == (25, 25)
    mass = SpecPrefillConfig(keep_mass=0.1, mass_floor=0.04, mass_ceiling=0.2, token_floor=40, select_chunk=4)
    assert mass.chunk_range(25) == (10, 10)
    importance = np.zeros(100)
    importance[50] = 1.0
    edges = SpecPrefillConfig(keep_tokens=4, select_chunk=4, keep_first=3, keep_last=5, force_keep_last=False)
    kept = specprefill.select_tokens(importance, edges).kept.tolist()
    assert kept == [0, 1, 2, 48, 49, 50, 51, 95, 96, 97, 98, 99]
    assert len(kept) <= specprefill.keep_count_upper_bound(100, edges)
    tiny = specprefill.select_tokens(np.ones(3), SpecPrefillConfig(keep_first=10, keep_last=10)).kept.tolist()
    assert tiny == [0, 1, 2]


def test_scoring_layers_as_a_share_of_the_speculator():
    assert SpecPrefillConfig(layers="last-0.5").layer_indices(24) == list(range(12, 24))
    assert SpecPrefillConfig(layers="last-0.67").layer_indices(24) == list(range(8, 24))
    assert SpecPrefillConfig(layers="last-0.1").layer_indices(3) == [2]  # at least one layer
    assert SpecPrefillConfig(layers="first-2").layer_indices(5) == [0, 1]
    for bad in ("last-1.5", "last-0", "last-x", "middle-0.5"):
        with pytest.raises(ConfigError):
            SpecPrefillConfig(layers=bad)


@pytest.mark.parametrize("fields", [{"token_floor": -1}, {"keep_first": 1.5}, {"keep_last": True}])
def test_bad_floor_or_edges_are_one_config_error(fields):
    with pytest.raises(ConfigError):
        SpecPrefillConfig(**fields)


def test_keep_growth_shrinks_the_share_past_4k_tokens_as_the_length_grows():
    """Issue 47 item 2: tokens kept ~ length ** g past GROWTH_FROM (4096) tokens, the ratio as given
    up to there; g 1 or none is today's fixed share."""
    grow = SpecPrefillConfig(keep_ratio=0.3, keep_growth=0.7)
    assert grow.share(2000) == grow.share(4096) == 0.3 == SpecPrefillConfig().share(32768)
    assert grow.share(32768) == pytest.approx(0.3 * 8**-0.3)  # 0.161
    assert SpecPrefillConfig(keep_growth=1.0).share(65536) == 0.3
    # kept tokens grow as the length ** 0.7: twice the prompt, 2 ** 0.7 the tokens
    assert grow.share(65536) * 65536 / (grow.share(32768) * 32768) == pytest.approx(2**0.7)
    assert grow.n_kept_chunks(1024) == math.ceil(1024 * 0.3 * 8**-0.3)  # 165 of a 32K prompt's chunks, not 308
    assert grow.n_kept_chunks(100) == 30  # under 4K: the ratio
    assert dataclasses.replace(grow, select_units="text").token_budget(32768) == math.ceil(32768 * 0.3 * 8**-0.3)
    # the reference and production keep what the config counts, the same tokens
    importance, config = np.random.default_rng(0).random(32768), dataclasses.replace(grow, force_keep_last=False)
    want = specprefill.select_tokens(importance, config).kept
    assert len(want) == 165 * 32
    np.testing.assert_array_equal(selection.select_tokens(importance, config).kept, want)


def test_growth_from_moves_where_the_share_starts_to_fall():
    """growth_from: the ratio holds up to it, then falls as (P / growth_from) ** (g - 1); without
    keep_growth it changes nothing."""
    late = SpecPrefillConfig(keep_ratio=0.1, keep_growth=0.5, growth_from=16384)
    assert late.share(4096) == late.share(16000) == late.share(16384) == 0.1
    assert late.share(32768) == pytest.approx(0.1 * 2**-0.5)
    assert late.n_kept_chunks(500) == 50 and late.n_kept_chunks(1024) == math.ceil(1024 * 0.1 * 2**-0.5)
    assert SpecPrefillConfig(keep_ratio=0.1, growth_from=16384).share(65536) == 0.1
    assert SpecPrefillConfig(keep_growth=0.5).growth_from == GROWTH_FROM == 4096
    parser = argparse.ArgumentParser()
    add_method_options(parser)
    given = specprefill_config(parser.parse_args(["--keep", "0.1", "--keep-growth", "0.5", "--growth-from", "16384"]))
    assert given == late


@pytest.mark.parametrize("value", [0, -5, 2.5, True, "16K"])
def test_bad_growth_from_is_one_config_error(value):
    with pytest.raises(ConfigError, match="growth_from"):
        SpecPrefillConfig(keep_growth=0.5, growth_from=value)


def test_keep_growth_zero_holds_the_budget_past_growth_from():
    """g 0: the ratio up to growth_from, then a fixed budget of keep_ratio x growth_from tokens."""
    fixed = SpecPrefillConfig(keep_ratio=0.1, keep_growth=0, growth_from=16384)
    assert fixed.keep_growth == 0.0 and fixed.share(16000) == 0.1
    assert fixed.share(32768) == pytest.approx(0.05) and fixed.share(131072) == pytest.approx(0.0125)
    assert fixed.n_kept_chunks(1024) == fixed.n_kept_chunks(4096) == math.ceil(16384 * 0.1 / 32)


@pytest.mark.parametrize(
    "fields", [dict(keep_growth=-0.1), dict(keep_growth=1.5), dict(keep_growth="x"), dict(keep_growth=float("nan"))]
)
def test_bad_keep_growth_is_one_config_error(fields):
    with pytest.raises(ConfigError, match="keep_growth"):
        SpecPrefillConfig(**fields)


def test_keep_growth_scales_a_ratio_only_and_with_keep_drops_it_with_a_budget():
    for other in ({"keep_tokens": 1600}, {"keep_mass": 0.5}):
        with pytest.raises(ConfigError, match="keep_growth scales the keep ratio"):
            SpecPrefillConfig(keep_growth=0.7, **other)
    grow = SpecPrefillConfig(keep_growth=0.7)
    assert grow.with_keep(ratio=0.2).keep_growth == 0.7
    assert grow.with_keep(tokens=1600).keep_growth is None and grow.with_keep(mass=0.5).keep_growth is None
    parser = argparse.ArgumentParser()
    add_method_options(parser)
    assert specprefill_config(parser.parse_args(["--keep", "0.2", "--keep-growth", "0.7"])).share(32768) == (
        pytest.approx(0.2 * 8**-0.3)
    )
    with pytest.raises(ConfigError, match="keep_growth"):
        specprefill_config(parser.parse_args(["--keep", "1600", "--keep-growth", "0.7"]))
