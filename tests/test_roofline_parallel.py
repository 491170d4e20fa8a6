"""The roofline's sharded prefill (tensor / pipeline over N devices) and the composition (SpecPrefill
whose speculator prefills with H2O), against hand-computed cases (evaluation/roofline.py)."""

from __future__ import annotations

import pytest

from specfill.core.config import H2OConfig
from specfill.evaluation.roofline import (
    DEVICES,
    Link,
    Method,
    Parallel,
    Rates,
    Shape,
    all_gather_seconds,
    all_reduce_seconds,
    communication_seconds,
    h2o_pairs,
    predict,
)

TINY = Shape("tiny", 2, 64, 4, 2, 16, 128, 100)
SLOW = Link("slow", 1e6, 1e-3, "test")  # 1 MB/s, 1 ms a message
FREE = Link("free", 1e30, 0.0, "test")
COMPUTE = Rates("compute-bound", 1e12, 1e12, 1e30, "test")  # memory never the bound
LLAMA_1B = Shape("Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256)
LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)


def test_ring_collectives_by_hand():
    link = Link("1 GB/s", 1e9, 0.0, "test")
    assert all_reduce_seconds(1e9, 1, link) == 0.0
    assert all_reduce_seconds(1e9, 2, link) == pytest.approx(1.0)  # 2 messages of 0.5 GB
    assert all_reduce_seconds(1e9, 4, link) == pytest.approx(1.5)  # 6 messages of 0.25 GB
    assert all_gather_seconds(1e9, 4, link) == pytest.approx(3.0)  # 3 messages of 1 GB
    assert all_reduce_seconds(0, 4, Link("latency", 1e9, 1e-3, "test")) == pytest.approx(6e-3)


def test_communication_per_step_by_hand():
    """3000 tokens in steps of 2048: 2048 then 952 tokens, hidden 64, 2 bytes a value, 2 ranks."""
    steps = [2048 * 64 * 2, 952 * 64 * 2]  # bytes of one step's hidden states
    # tensor: 2 all-reduces per layer, 2 layers; each 2 * 1 * (b / 2 / 1e6 + 1e-3)
    tensor = sum(4 * (b / 1e6 + 2e-3) for b in steps)
    assert communication_seconds(TINY, 3000, 2, Parallel("tensor", 2, SLOW)) == pytest.approx(tensor)
    # pipeline: one hand-off + an all-gather over 2 ranks, each b / 1e6 + 1e-3
    pipeline = sum(2 * (b / 1e6 + 1e-3) for b in steps)
    assert communication_seconds(TINY, 3000, 2, Parallel("pipeline", 2, SLOW)) == pytest.approx(pipeline)
    assert communication_seconds(TINY, 3000, 2, Parallel("tensor", 1, SLOW)) == 0.0


def test_tensor_parallelism_splits_the_layers_but_not_the_logits():
    one = predict(TINY, COMPUTE, 512, Method("full"))
    two = predict(TINY, COMPUTE, 512, Method("full"), parallel=Parallel("tensor", 2, FREE))
    logits = 2 * TINY.hidden * TINY.vocab / 1e12
    assert two["attention"] == pytest.approx(one["attention"] / 2)
    assert two["linear"] - logits == pytest.approx((one["linear"] - logits) / 2)
    assert two["communication"] == pytest.approx(0.0, abs=1e-20) and two["ttft"] == pytest.approx(
        two["linear"] + two["attention"]
    )


def test_pipeline_parallelism_adds_its_hand_offs_to_one_device_time():
    one = predict(TINY, COMPUTE, 3000, Method("full"))
    two = predict(TINY, COMPUTE, 3000, Method("full"), parallel=Parallel("pipeline", 2, SLOW))
    assert two["linear"] == one["linear"] and two["attention"] == one["attention"]
    assert two["ttft"] == pytest.approx(
        one["ttft"] + communication_seconds(TINY, 3000, 2, Parallel("pipeline", 2, SLOW))
    )


def test_sharding_refusals():
    with pytest.raises(ValueError, match="do not split over 4 ranks"):
        predict(TINY, COMPUTE, 64, Method("full"), parallel=Parallel("tensor", 4, FREE))
    with pytest.raises(ValueError, match="separate speculator"):
        predict(TINY, COMPUTE, 64, Method("specprefill"), parallel=Parallel("tensor", 2, FREE))
    with pytest.raises(ValueError, match="parallel kind 'data'"):
        Parallel("data", 2, FREE)


def test_h2o_pairs_by_hand():
    """10 tokens, S = 4, L + H = 2, no tail: chunks of 4, 4, 2 -> causal 10 + 10 + 3, memories
    4 * 2 + 2 * 2: 35 pairs, against 55 for full; H2O in the first of 2 layers: (35 + 55) / 2."""
    config = H2OConfig(chunk_size=4, batch_size=4, local=1, heavy=1, dense_tail=0, layers="all")
    assert h2o_pairs(10, config, 2) == 35
    assert (
        h2o_pairs(10, H2OConfig(chunk_size=4, batch_size=4, local=1, heavy=1, dense_tail=0, layers="first-1"), 2) == 45
    )
    assert h2o_pairs(4, config, 2) == 10  # one chunk: full


def test_the_composition_prices_the_speculators_pass_as_h2o():
    """Only the speculator's attention changes: 4 * head_dim * heads * pairs * layers FLOPs."""
    config = H2OConfig(chunk_size=4, batch_size=4, local=1, heavy=1, dense_tail=0, layers="all")
    plain = predict(TINY, COMPUTE, 10, Method("specprefill", speculator=TINY))
    composed = predict(TINY, COMPUTE, 10, Method("specprefill", speculator=TINY, speculator_h2o=config))
    saved = 4 * TINY.head_dim * TINY.heads * (55 - 35) * TINY.layers / 1e12
    assert plain["speculator"] - composed["speculator"] == pytest.approx(saved)
    for part in ("lookahead", "scoring", "main_linear", "main_attention"):
        assert composed[part] == plain[part]


def test_the_composition_beats_specprefill_at_long_prompts_on_h100():
    """Issue 38's acceptance line: the speculator's dense pass caps SpecPrefill; H2O lifts the cap."""
    full = predict(LLAMA_8B, DEVICES["h100"], 131072, Method("full"))["ttft"]
    plain = predict(LLAMA_8B, DEVICES["h100"], 131072, Method("specprefill", speculator=LLAMA_1B))["ttft"]
    composed = predict(
        LLAMA_8B,
        DEVICES["h100"],
        131072,
        Method("specprefill", speculator=LLAMA_1B, speculator_h2o=H2OConfig(layers="all")),
    )["ttft"]
    assert composed < plain < full
