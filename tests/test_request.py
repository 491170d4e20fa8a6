"""core/request.build_request: every generation setting's one check (issue #23 item 1). The API,
the CLI and the server all reach these through build_request (tests/serve/test_request_parity.py
and the CLI tests check the translations)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from specfill.core import ConfigError, H2OConfig, SpecfillWarning, SpecPrefillConfig
from specfill.core.request import GenerationRequest, build_request
from specfill.core.runtime import Drafting, PrefillMethod, SamplingConfig


@pytest.mark.parametrize(
    "settings,word",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"method": "fast"}, "method must be"),
        ({"auto_threshold": 10}, "goes with method auto"),
        ({"method": "auto", "auto_threshold": 0}, "auto threshold"),
        ({"method": "specprefill"}, "needs --speculator"),
        ({"num_draft_tokens": 0, "draft_model": "self:1"}, "num_draft_tokens"),
        ({"num_draft_tokens": 2}, "without a draft model"),
        ({"draft_model": "self:1", "top_k": 5}, "with top_k, min_p or a penalty"),
    ],
)
def test_each_setting_has_one_check(settings, word):
    with pytest.raises(ConfigError, match=word):
        build_request(**settings)


def test_a_request_holds_checked_parts():
    request = build_request(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        method="specprefill",
        speculator="self:2",
        specprefill=SpecPrefillConfig(keep_tokens=64),
        num_draft_tokens=2,
    )
    assert request == GenerationRequest(
        7,
        SamplingConfig(0.5, 0.9),
        PrefillMethod("specprefill", specprefill=SpecPrefillConfig(keep_tokens=64), speculator="self:2"),
        Drafting(None, 2),
    )
    assert build_request(draft_model="self:1").drafting == Drafting("self:1", 3)  # mlx-lm's default k
    assert build_request(method="h2o").method.h2o == H2OConfig()
    auto = build_request(method="auto", speculator="self:1", auto_threshold=100).method
    assert (auto.sparse, auto.auto_threshold, auto.speculator) == ("specprefill", 100, "self:1")


def test_an_unknown_setting_is_named_not_dropped():
    """build_request takes the sampler's and the method's settings as one mapping (their lists are
    SamplingConfig's fields and prefill_method's keywords): a misspelled one is a TypeError naming
    it, even beside a PrefillMethod built already (which reads none of the method's keywords)."""
    with pytest.raises(TypeError, match="temprature"):
        build_request(method=PrefillMethod("full"), temprature=0.5)
    with pytest.raises(TypeError, match="speculater"):
        build_request(speculater="self:1")
    plan = PrefillMethod("full")
    assert build_request(method=plan, temperature=0.5, seed=3).sampling == SamplingConfig(0.5, 1.0, 3)


def test_keep_ratio_and_keep_tokens_are_exclusive():
    """Neither: ratio 0.3; both: an error, never a silent winner; with_keep switches cleanly."""
    assert (SpecPrefillConfig().keep_ratio, SpecPrefillConfig().keep_tokens) == (0.3, None)
    with pytest.raises(ConfigError, match="not both"):
        SpecPrefillConfig(keep_ratio=0.2, keep_tokens=64)
    with pytest.raises(ConfigError, match="not both"):
        dataclasses.replace(SpecPrefillConfig(keep_tokens=64), keep_ratio=0.3)
    tokens = SpecPrefillConfig(lookahead=3).with_keep(tokens=64)
    assert (tokens.keep_ratio, tokens.keep_tokens, tokens.lookahead) == (None, 64, 3)
    ratio = tokens.with_keep(ratio=0.3)
    assert (ratio.keep_ratio, ratio.keep_tokens) == (0.3, None)
    assert ratio.with_keep() is ratio


def test_settings_for_another_method_warn_once():
    with pytest.warns(SpecfillWarning, match="H2O settings do nothing with method 'specprefill'"):
        build_request(method="specprefill", speculator="self:1", h2o=H2OConfig())
    with pytest.warns(SpecfillWarning, match="SpecPrefill settings and a speculator do nothing with method 'h2o'"):
        build_request(method="h2o", specprefill=SpecPrefillConfig(), speculator="self:1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_request(method="auto", h2o=H2OConfig(), specprefill=SpecPrefillConfig(), speculator="self:1")
