"""The SpecPrefill selection options and H2O's memory share as per-request fields (keep_mass,
mass_floor, mass_ceiling, lookahead_reduction, neighbours, h2o_memory_share), through the openai
client: the library's text for the same settings, their range errors as 400s naming the field, and
mass bounds without keep_mass refused (core/config.py's one check, not silently ignored)."""

from __future__ import annotations

import openai
import pytest

from specfill.api import generate, load
from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo
from specfill.evaluation.serve_process import client

PROMPT = " ".join(str(i % 97 + 3) for i in range(160))
MASS = {"keep_mass": 0.4, "mass_floor": 0.1, "mass_ceiling": 0.3, "lookahead_reduction": "max", "neighbours": 1}


@pytest.fixture(scope="module")
def tiny_local():
    """The tiny server's model, loaded here (random weights from a fixed seed: the same model)."""
    return load("random:tiny-llama", backend="cuda", device="cpu")


def complete(server, **fields):
    return client(server).completions.create(
        model=server.model, prompt=PROMPT, max_tokens=6, extra_body={"prompt_cache": "off", **fields}
    )


def test_selection_fields_give_the_librarys_run(tiny_server, tiny_local):
    """The fields reach the selection: kept tokens and text as generate() with the same config,
    and different from the server's default keep ratio."""
    reply = complete(tiny_server, method="specprefill", **MASS)
    stats = reply.model_extra["specfill"]
    info = GenerationInfo()
    local = generate(
        *tiny_local,
        PROMPT,
        6,
        method="specprefill",
        speculator="self:1",
        prefill_info=info,
        specprefill=SpecPrefillConfig(**MASS),
    )
    assert reply.choices[0].text == local and stats["kept_tokens"] == info.kept_tokens
    default = complete(tiny_server, method="specprefill").model_extra["specfill"]["kept_tokens"]
    assert default != stats["kept_tokens"]


def test_h2o_memory_share_field(tiny_server, tiny_local):
    fields = {"h2o_chunk_size": 32, "h2o_batch_size": 64, "h2o_local": 4, "h2o_heavy": 4}
    shared = complete(tiny_server, method="h2o", h2o_memory_share=0.05, **fields).choices[0].text
    local = generate(
        *tiny_local,
        PROMPT,
        6,
        method="h2o",
        h2o=H2OConfig(chunk_size=32, batch_size=64, local=4, heavy=4, memory_share=0.05),
    )
    assert shared == local


def test_speculator_prefill_field_runs_and_names_the_composition(tiny_server, tiny_local):
    """speculator_prefill: "h2o" runs SpecPrefill over an H2O speculator, named specprefill+h2o in
    the reply's statistics, with the library's text and kept tokens for the same config (the
    prompt is one H2O chunk here: tests/methods/test_composed_model.py holds the sparse pass)."""
    reply = complete(tiny_server, method="specprefill", speculator_prefill="h2o")
    stats = reply.model_extra["specfill"]
    info = GenerationInfo()
    config = SpecPrefillConfig(speculator_prefill="h2o")
    local = generate(
        *tiny_local, PROMPT, 6, method="specprefill", speculator="self:1", prefill_info=info, specprefill=config
    )
    assert stats["prefill_method"] == info.method == "specprefill+h2o"
    assert reply.choices[0].text == local and stats["kept_tokens"] == info.kept_tokens
    dense = complete(tiny_server, method="specprefill", speculator_prefill="dense").model_extra["specfill"]
    assert dense["prefill_method"] == "specprefill"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"keep_mass": 1.5}, "keep_mass"),
        ({"keep_mass": 0.5, "mass_floor": 0}, "mass_floor"),
        ({"keep_mass": 0.5, "mass_ceiling": 1.2}, "mass_ceiling"),
        ({"mass_floor": 0.1}, "mass_floor"),
        ({"mass_ceiling": 0.4}, "mass_ceiling"),
        ({"keep_ratio": 0.2, "mass_floor": 0.1}, "mass_floor"),
        ({"keep_mass": 0.5, "keep_tokens": 10}, "keep_tokens"),
        ({"neighbours": -1}, "neighbours"),
        ({"lookahead_reduction": "sum"}, "lookahead_reduction"),
        ({"lookahead_reduction": "max", "lookahead": 2}, None),
        ({"h2o_memory_share": 1.0, "method": "h2o"}, "h2o_memory_share"),
        ({"keep_mass": "x"}, "keep_mass"),
        ({"neighbours": "one"}, "neighbours"),
        ({"speculator_prefill": "sparse"}, "speculator_prefill"),
        ({"speculator_prefill": 1}, "speculator_prefill"),
    ],
)
def test_bad_values_name_the_field(tiny_server, fields, param):
    body = {"method": "specprefill", **fields}
    if param is None:  # both valid: served
        assert complete(tiny_server, **body).usage.completion_tokens == 6
        return
    with pytest.raises(openai.BadRequestError) as refused:
        complete(tiny_server, **body)
    error = refused.value.body
    assert error["param"] == param, error
    assert param.removeprefix("h2o_") in error["message"] or param in error["message"], error


def test_mass_bounds_without_keep_mass_are_one_config_error():
    for bounds in ({"mass_floor": 0.1}, {"mass_ceiling": 0.3}, {"mass_floor": 0.1, "mass_ceiling": 0.3}):
        with pytest.raises(ConfigError, match="give keep_mass too"):
            SpecPrefillConfig(keep_ratio=0.2, **bounds)
    mass = SpecPrefillConfig(keep_mass=0.5, mass_floor=0.2)
    assert (mass.mass_floor, mass.mass_ceiling) == (0.2, 0.5)  # the ceiling's default filled in
    ratio = mass.with_keep(ratio=0.3)  # replacing the mass rule drops its bounds
    assert ratio.keep_ratio == 0.3 and ratio.mass_floor is None and ratio.mass_ceiling is None
