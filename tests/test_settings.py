"""Setting checks and clamps (core/request.py and the configs it builds), the NaN guard
(core.checks) and the model-config checks every loading path ends in (ModelArgs)."""

from __future__ import annotations

import dataclasses
import shutil
import warnings

import numpy as np
import pytest

from specfill.core import ConfigError, ModelLoadError, NonFiniteLogitsError, SpecfillWarning, SpecPrefillConfig
from specfill.core.checks import check_logits_finite
from specfill.core.plan import check_reuse, check_token_ids
from specfill.core.request import build_request, fit_to_prompt
from specfill.core.runtime import Drafting, KVState, PrefillMethod, SamplingConfig
from tests.fixtures import tiny_model_args, tiny_weights


@pytest.mark.parametrize(
    "temperature,top_p,seed,word",
    [
        (float("inf"), 1.0, None, "temperature"),
        (float("nan"), 1.0, None, "temperature"),
        (-0.1, 1.0, None, "temperature"),
        ("1", 1.0, None, "temperature"),
        (0.7, float("nan"), None, "top_p"),
        (0.7, 1.5, None, "top_p"),
        (0.7, 1.0, 2**70, "seed"),
        (0.7, 1.0, -1, "seed"),
        (0.7, 1.0, 1.5, "seed"),
        (0.7, 1.0, True, "seed"),
    ],
)
def test_bad_sampling_settings(temperature, top_p, seed, word):
    with pytest.raises(ConfigError, match=word):
        SamplingConfig(temperature, top_p, seed)
    with pytest.raises(ConfigError, match=word):
        build_request(temperature=temperature, top_p=top_p, seed=seed)


def test_sampling_settings_that_do_nothing_warn():
    with pytest.warns(SpecfillWarning, match="temperature 0"):
        build_request(top_p=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_request(temperature=0.7, top_p=0.9, seed=2**63 - 1)
        build_request(method="h2o", h2o=object())
    with pytest.warns(SpecfillWarning, match="SpecPrefill settings and a speculator do nothing with method 'full'"):
        build_request(specprefill=SpecPrefillConfig(), speculator="self:2")


def test_specprefill_settings_are_clamped_to_the_prompt():
    plan = PrefillMethod(
        "specprefill",
        specprefill=SpecPrefillConfig(lookahead=10**9, select_chunk=1000, pool_kernel=101, keep_tokens=5),
        speculator="self:1",
    )
    with pytest.warns(SpecfillWarning, match="look-ahead 1000000000 clamped to 44"):
        fitted = fit_to_prompt(plan, 20, 64)
    config = fitted.specprefill
    assert (config.lookahead, config.select_chunk, config.pool_kernel, config.keep_tokens) == (44, 20, 39, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_to_prompt(
            PrefillMethod("specprefill", specprefill=SpecPrefillConfig(), speculator="self:1"), 2000, 8192
        ) == PrefillMethod("specprefill", specprefill=SpecPrefillConfig(), speculator="self:1")


@pytest.mark.parametrize("value", [2**31, 2**63])
def test_method_sizes_are_bounded(value):
    with pytest.raises(ConfigError, match="2147483647"):
        SpecPrefillConfig(select_chunk=value)
    with pytest.raises(ConfigError, match="2147483647"):
        SpecPrefillConfig(keep_tokens=value)


def test_nan_guard_names_the_likely_cause():
    args = tiny_model_args("llama")
    check_logits_finite(True, args, where="x")
    with pytest.raises(NonFiniteLogitsError, match="overflowed float16.*float32"):
        check_logits_finite(False, args, where="the first prefill", dtype="float16")
    with pytest.raises(NonFiniteLogitsError, match="weights or numerics are broken.*rms_norm_eps=1e-06"):
        check_logits_finite(False, args, where="the first prefill")


@pytest.mark.parametrize(
    "changes,word",
    [
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"rms_norm_eps": 2.0}, "at most 1"),
        ({"rope_theta": float("inf")}, "rope_theta"),
        ({"rope_theta": 0.5}, "at least 1"),
        ({"head_dim": 15}, "odd"),
        ({"hidden_size": 2**40}, "hidden_size"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"rope_scaling": {"rope_type": "linear"}}, "lacks factor"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks low_freq_factor"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "not supported"),
        ({"bos_token_id": -1}, "special token id"),
    ],
)
def test_model_args_refuse_numbers_that_compute_nan(changes, word):
    with pytest.raises(ModelLoadError, match=word):
        dataclasses.replace(tiny_model_args("llama"), **changes)


@pytest.mark.parametrize("backend", ["cuda", "mlx"])
def test_a_model_that_computes_inf_is_refused_at_load(tmp_path, tiny_checkpoint, backend):
    """Finite weights whose product overflows float32: the one-token check at load refuses it."""
    pytest.importorskip("torch" if backend == "cuda" else "mlx.core")
    from safetensors.numpy import save_file

    from specfill.api import load

    path = tmp_path / "overflow"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), path)
    weights = tiny_weights(tiny_model_args("llama"))
    weights["model.norm.weight"] = np.full_like(weights["model.norm.weight"], 3e38)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(NonFiniteLogitsError, match="NaN or Inf logits"):
        load(str(path), backend=backend, device="cpu")


def test_prompt_ids_are_integers_inside_the_vocabulary():
    assert check_token_ids([1, np.int64(2)], 10).tolist() == [1, 2]
    for ids, word in (
        ([], "empty"),
        ([1.5], "integers"),
        ([float("nan")], "integers"),
        ([10], "outside"),
        ([-1], "outside"),
    ):
        with pytest.raises(ConfigError, match=word):
            check_token_ids(ids, 10)


def test_reuse_checks_where_it_meets_the_request():
    """The driver's one check of a reused cache (core/plan.check_reuse): a proper prefix, full
    or H2O prefill (H2O from a dense prefix only), no speculative decoding yet; each error names
    the setting at fault."""
    reuse = KVState(cache=None, slots=3)
    check_reuse(reuse, 5, PrefillMethod(), None)
    with pytest.raises(ConfigError, match="speculative decoding with a reused KV cache") as err:
        check_reuse(reuse, 5, PrefillMethod(), Drafting("self:1", 2))
    assert (err.value.config, err.value.field) == ("Drafting", "num_tokens")
    check_reuse(reuse, 5, PrefillMethod("h2o"), None)
    with pytest.raises(ConfigError, match="H2O from a reused KV cache needs a dense prefix"):
        check_reuse(KVState(cache=None, slots=3, position_offset=2), 7, PrefillMethod("h2o"), None)
    with pytest.raises(ConfigError, match="must cover"):
        check_reuse(reuse, 3, PrefillMethod(), None)
