"""Config validation: clear errors, the seed's clamping rule, selection arithmetic."""

import warnings

import pytest

from specfill.core import ConfigError, H2OConfig, SpecfillWarning, SpecPrefillConfig


def test_h2o_defaults_are_the_seed_recommendation():
    c = H2OConfig()
    assert (c.chunk_size, c.batch_size, c.local, c.heavy) == (1024, 16384, 256, 256)
    assert c.enabled and c.memory_size == 512


@pytest.mark.parametrize("local,heavy,want", [(6, 6, (6, 1)), (8, 0, (7, 0)), (20, 5, (7, 0)), (3, 5, (3, 4))])
def test_h2o_clamps_memory_below_chunk_with_a_warning(local, heavy, want):
    with pytest.warns(SpecfillWarning, match="clamped"):
        c = H2OConfig(chunk_size=8, batch_size=8, local=local, heavy=heavy)
    assert (c.local, c.heavy) == want and c.memory_size < 8


def test_h2o_no_warning_when_valid_and_disabled_when_empty():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not H2OConfig(chunk_size=8, batch_size=16, local=0, heavy=0).enabled


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(chunk_size=0), "chunk_size"),
        (dict(batch_size=1000, chunk_size=512), "multiple"),
        (dict(local=-1), "local"),
        (dict(heavy=1.5), "integer"),
        (dict(chunk_size=True), "integer"),
    ],
)
def test_h2o_rejects_bad_settings(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        H2OConfig(**kwargs)


def test_specprefill_defaults_follow_the_reference_implementation():
    c = SpecPrefillConfig()
    assert (c.keep_ratio, c.lookahead, c.pool_kernel, c.select_chunk) == (0.3, 8, 13, 32)
    assert (
        SpecPrefillConfig.paper() == SpecPrefillConfig(keep_ratio=0.1)
        and SpecPrefillConfig.paper(lookahead=2).lookahead == 2
    )
    assert (c.head_reduction, c.layer_reduction, c.layers, c.force_keep_last) == ("max", "max", "all", True)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(keep_ratio=0.0), "keep ratio"),
        (dict(keep_ratio=1.5), "keep ratio"),
        (dict(keep_ratio=float("nan")), "keep ratio"),
        (dict(keep_tokens=0), "keep_tokens"),
        (dict(pool_kernel=4), "odd"),
        (dict(select_chunk=0), "select_chunk"),
        (dict(lookahead=-1), "lookahead"),
        (dict(layers="middle-2"), "layers"),
        (dict(layers="last-0"), "layers"),
        (dict(head_reduction="sum"), "head"),
    ],
)
def test_specprefill_rejects_bad_settings(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SpecPrefillConfig(**kwargs)


def test_kept_chunk_count():
    assert SpecPrefillConfig(keep_ratio=0.3).n_kept_chunks(10) == 3  # not 4 from 3.0000000000000004
    assert SpecPrefillConfig(keep_ratio=0.1).n_kept_chunks(3) == 1
    assert SpecPrefillConfig(keep_ratio=1.0).n_kept_chunks(7) == 7
    assert SpecPrefillConfig(keep_tokens=1).n_kept_chunks(50) == 1
    assert SpecPrefillConfig(keep_tokens=65).n_kept_chunks(50) == 3
    assert SpecPrefillConfig(keep_tokens=10_000).n_kept_chunks(5) == 5


def test_layer_selection():
    assert SpecPrefillConfig(layers="last-2").layer_indices(5) == [3, 4]
    assert SpecPrefillConfig(layers="last-9").layer_indices(5) == [0, 1, 2, 3, 4]
    assert SpecPrefillConfig().layer_indices(3) == [0, 1, 2]


def test_dense_tail_is_a_non_negative_integer_and_scoring_layers_are_checked():
    assert H2OConfig(dense_tail=0).dense_tail == 0 and H2OConfig().dense_tail == 64
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="dense_tail"):
            H2OConfig(dense_tail=bad)
    assert SpecPrefillConfig(layers="last-1").layer_indices(8) == [7]
    assert SpecPrefillConfig(layers="last-3").layer_indices(8) == [5, 6, 7]
    with pytest.raises(ConfigError, match="layers"):
        SpecPrefillConfig(layers="middle")


def test_speculator_h2o_means_one_thing_however_spelled():
    """Issue 47: H2OConfig() handed to speculator_prefill runs H2O in every layer, as "h2o" does
    (it gave first-0.33, H2OConfig's main-model default, and 1.76x where "h2o" gave 2.60x); given
    layers are kept; the main model's H2OConfig() still runs its first third only."""
    from specfill.core.config import speculator_h2o

    assert SpecPrefillConfig(speculator_prefill=H2OConfig()) == SpecPrefillConfig(speculator_prefill="h2o")
    assert SpecPrefillConfig(speculator_prefill=H2OConfig()).speculator_prefill == speculator_h2o()
    assert SpecPrefillConfig(speculator_prefill=H2OConfig()).speculator_prefill.layer_indices(6) == list(range(6))
    given = SpecPrefillConfig(speculator_prefill=H2OConfig(layers="first-2")).speculator_prefill
    assert given.layer_indices(6) == [0, 1]
    assert H2OConfig().layer_indices(30) == H2OConfig(layers="first-0.33").layer_indices(30) == list(range(10))
    assert H2OConfig(memory_share=0.1).for_prompt(1000).layer_indices(30) == list(range(10))
