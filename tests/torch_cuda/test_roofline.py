"""The roofline model (evaluation/roofline.py) and the rate measurement it is checked with."""

from __future__ import annotations

import pytest

from specfill.evaluation.roofline import DEVICES, Method, Rates, Shape, predict

LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)
TINY = Shape("tiny", 2, 64, 4, 2, 16, 128, 100)


def test_full_prefill_is_priced_by_its_flops_on_a_compute_bound_device():
    """8B at 8K on H100: 2 * tokens * params for the linear layers plus 4 * D * heads * pairs."""
    parts = predict(LLAMA_8B, DEVICES["h100"], 8192, Method("full"))
    linear_flops = 2 * 8192 * LLAMA_8B.layer_params() * LLAMA_8B.layers
    assert parts["linear"] == pytest.approx(linear_flops / 989.4e12, rel=0.02)
    pairs = 8192 * 8193 // 2
    assert parts["attention"] == pytest.approx(4 * 128 * 32 * pairs * 32 / 989.4e12, rel=1e-6)
    assert parts["ttft"] == pytest.approx(parts["linear"] + parts["attention"])


def test_bandwidth_bound_parts_are_priced_by_their_bytes():
    slow = Rates("slow memory", 1e18, 1e18, 1e9, "test")
    parts = predict(TINY, slow, 1, Method("full"), width=4)
    weights = TINY.layer_params() * TINY.layers * 4 + TINY.hidden * TINY.vocab * 4
    assert parts["linear"] == pytest.approx(weights / 1e9)


def test_sparse_methods_beat_full_at_long_prompts_and_grow_with_length():
    speedups = []
    for tokens in (8192, 131072):
        full = predict(LLAMA_8B, DEVICES["rtx4090"], tokens, Method("full"))["ttft"]
        h2o = predict(LLAMA_8B, DEVICES["rtx4090"], tokens, Method("h2o"))["ttft"]
        spec = predict(
            LLAMA_8B, DEVICES["rtx4090"], tokens, Method("specprefill", speculator=LLAMA_8B.first_layers(8))
        )["ttft"]
        assert h2o < full and spec < full
        speedups.append(full / h2o)
    assert speedups[1] > speedups[0]


def test_h2o_is_priced_in_the_layers_it_runs_in():
    """The default walks H2O in the first third of the layers (core/config.py): the others cost full
    attention; the linear layers cost the same either way."""
    from specfill.core.config import H2OConfig

    tokens = 32768
    full, every, default = (
        predict(LLAMA_8B, DEVICES["h100"], tokens, method)
        for method in (Method("full"), Method("h2o", h2o=H2OConfig(layers="all")), Method("h2o"))
    )
    walked = len(H2OConfig().layer_indices(32))
    assert 0 < walked < 32 and every["linear"] == default["linear"] == full["linear"]
    assert default["attention"] == pytest.approx(
        (walked * every["attention"] + (32 - walked) * full["attention"]) / 32, rel=1e-9
    )


def test_a_reused_prefix_is_read_by_every_new_query():
    """An agent's next turn (prefix): full prefill of the new part reads every prefix key; H2O from
    the prefix reads it in its first chunk and its dense tail only; SpecPrefill's speculator reads it
    as full does, the composition's as H2O does; prefix 0 is the plain prompt."""
    from specfill.core.config import H2OConfig, speculator_h2o
    from specfill.core.methods.h2o import h2o_dot_products
    from specfill.evaluation.roofline import dense_pairs, h2o_pairs

    assert dense_pairs(4, 10) == 4 * 10 + 10 and dense_pairs(4) == 10
    config = H2OConfig(layers="all")
    new, prefix = 4096, 8192
    sparse = h2o_dot_products(new, 1024, 512, 64) + (1024 + 64) * prefix
    assert h2o_pairs(new, config, 32, prefix) == sparse
    assert h2o_pairs(512, config, 32, prefix) == dense_pairs(512, prefix)  # one chunk: full attention
    spec = Method("specprefill", speculator=LLAMA_8B.first_layers(8), keep=0.3)
    composed = Method("specprefill", speculator=LLAMA_8B.first_layers(8), keep=0.3, speculator_h2o=speculator_h2o())
    for method in (Method("full"), Method("h2o"), spec, composed):
        assert predict(LLAMA_8B, DEVICES["h100"], new, method, prefix=0) == predict(
            LLAMA_8B, DEVICES["h100"], new, method
        )
    full = predict(LLAMA_8B, DEVICES["h100"], new, Method("full"), prefix=prefix)
    assert full["attention"] == pytest.approx(4 * 128 * 32 * dense_pairs(new, prefix) * 32 / 989.4e12, rel=1e-6)
    plain, walked = (predict(LLAMA_8B, DEVICES["h100"], new, m, prefix=prefix) for m in (spec, composed))
    assert walked["speculator"] < plain["speculator"] < full["ttft"]
    assert walked["main_attention"] == plain["main_attention"] > 0  # the kept tokens read the whole prefix


def test_an_unknown_method_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown method 'sparse'"):
        predict(TINY, DEVICES["h100"], 16, Method("sparse"))


def test_measured_torch_rates_are_positive_and_named():
    from specfill.evaluation.rates import torch_rates

    rates = torch_rates(TINY, step=32, context=64, repeats=1)
    assert rates.gemm > 0 and rates.attention > 0 and rates.bandwidth > 0
    assert rates.name.startswith("torch cpu float32")
