"""core/sampling.py: the penalties, top_k and min_p by their llama.cpp / mlx-lm definitions, top_p's
nucleus, and the driver decoding through it on both backends exactly as a host loop over full
forwards does (every setting, temperature and top_p alone included: one sampler)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from specfill.core.errors import ConfigError
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.core.sampling import PENALTY_WINDOW, HostSampler, filtered, make_sampler, nucleus, penalize
from tests.fixtures.reference_runs import prompt
from tests.test_drafting import BACKENDS, load


def test_penalties_by_definition():
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    rep = penalize(logits, [0, 1, 1], SamplingConfig(repetition_penalty=2.0))
    assert rep.tolist() == [1.0, -4.0, 1.0, 0.5]  # positive / r, negative * r, unseen untouched
    both = penalize(logits, [0, 1, 1], SamplingConfig(presence_penalty=0.5, frequency_penalty=0.25))
    assert both.tolist() == [2.0 - 0.75, -2.0 - 1.0, 1.0, 0.5]  # presence once, frequency per occurrence
    assert penalize(logits, [], SamplingConfig(repetition_penalty=2.0)) is logits


def test_top_k_and_min_p_by_definition():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert np.isfinite(filtered(logits, SamplingConfig(top_k=2))).tolist() == [True, True, False, False, False]
    kept = np.isfinite(filtered(logits, SamplingConfig(min_p=0.3))).tolist()  # p >= 0.3 * 0.5 = 0.15
    assert kept == [True, True, True, False, False]
    assert np.isfinite(filtered(logits, SamplingConfig())).all()


def test_top_k_keeps_exactly_k_with_ties_to_the_lower_id():
    """Tied logits (16-bit logits tie often): top_k keeps k of them, the lowest ids, so top_k=1 is
    argmax's token at any temperature and seed (it used to keep every tied maximum and draw one)."""
    logits = np.array([1.0, 3.0, 2.0, 3.0, 3.0], dtype=np.float32)
    kept = {k: np.isfinite(filtered(logits, SamplingConfig(top_k=k))).tolist() for k in (1, 2, 4)}
    assert kept[1] == [False, True, False, False, False]
    assert kept[2] == [False, True, False, True, False]
    assert kept[4] == [False, True, True, True, True]
    for temperature in (0.5, 1.5, 3.0):
        draws = {
            HostSampler(SamplingConfig(temperature=temperature, top_k=1, seed=s)).choose(logits) for s in range(20)
        }
        assert draws == {int(np.argmax(logits))} == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.05, 0.5, 0.3, 0.15]))
    sampler = make_sampler(SamplingConfig(temperature=1.0, top_p=0.7, seed=0))
    draws = Counter(sampler(logits) for _ in range(400))
    assert set(draws) == {1, 2}  # 0.5 + 0.3 reaches 0.7; tokens 3 and 0 are cut
    assert 0.5 < draws[1] / 400 < 0.75  # renormalised 0.625
    plain = make_sampler(SamplingConfig(temperature=1.0, seed=0))
    assert set(Counter(plain(logits) for _ in range(400))) == {0, 1, 2, 3}


def test_low_temperature_sampling_is_greedy():
    sampler = make_sampler(SamplingConfig(temperature=1e-3, seed=0))
    assert {sampler(np.array([0.0, 1.0, 0.5], dtype=np.float32)) for _ in range(50)} == {1}


def whole_vocabulary_nucleus(probs, top_p):
    """top_p's definition over the whole sorted vocabulary (ties: the lower id first)."""
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    cut = np.zeros_like(probs)
    cut[order] = np.where(before < top_p, probs[order], 0.0)
    return cut / cut.sum()


@pytest.mark.parametrize("spread", [0.5, 3.0, 12.0])
def test_nucleus_sorting_candidates_only_is_the_whole_vocabulary_nucleus(spread):
    """Only the most likely tokens are sorted (more while the cut is past them): the same set as
    sorting the whole vocabulary, from a nucleus of one token to thousands, with tied probabilities
    at the candidates' edge."""
    rng = np.random.default_rng(3)
    for _ in range(5):
        logits = np.round(rng.standard_normal(5000) * spread, 1)  # rounded: many ties
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        for top_p in (0.05, 0.5, 0.9, 0.999):
            np.testing.assert_array_equal(nucleus(probs, top_p), whole_vocabulary_nucleus(probs, top_p))


def test_seeded_sampler_repeats():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    config = SamplingConfig(temperature=1.0, top_p=0.9, seed=4)
    first, again = make_sampler(config), make_sampler(config)
    assert [first(logits) for _ in range(20)] == [again(logits) for _ in range(20)]


@pytest.mark.slow
@pytest.mark.parametrize("backend, dtype", [("cuda", "bfloat16"), ("cuda", "float32"), ("mlx", "bfloat16")])
def test_top_k_1_is_greedy_on_the_demo_model(backend, dtype):
    """The demo model in bf16 (torch) ties its two best logits at this poem's first token: top_k=1
    at temperature 1.5 answers greedy's text, in either dtype, on either backend."""
    import specfill
    from specfill.core import ModelLoadError
    from specfill.core.io.demo_model import require_demo_model

    try:
        require_demo_model()
    except ModelLoadError as why:
        pytest.skip(str(why))
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    model, tokenizer = specfill.load(backend=backend, dtype=dtype, **({"device": "cpu"} if backend == "cuda" else {}))
    poem = [{"role": "user", "content": "Write a short poem about the sea."}]
    text = tokenizer.apply_chat_template(poem, add_generation_prompt=True, tokenize=False)
    greedy = specfill.generate(model, tokenizer, text, max_tokens=6)
    assert specfill.generate(model, tokenizer, text, max_tokens=6, temperature=1.5, top_k=1, seed=1) == greedy


def test_host_sampler_window_and_seed():
    sampler = HostSampler(SamplingConfig(repetition_penalty=1e9), history=range(PENALTY_WINDOW + 5))
    assert list(sampler.window)[0] == 5 and len(sampler.window) == PENALTY_WINDOW  # the last 64 only
    logits = np.array([5.0, 4.0, 3.0] + [0.0] * (PENALTY_WINDOW + 10), dtype=np.float32)
    fresh = HostSampler(SamplingConfig(repetition_penalty=1e9))
    assert [fresh.choose(logits) for _ in range(3)] == [0, 1, 2]  # greedy, each repeat pushed down
    config = SamplingConfig(temperature=1.0, top_k=3, seed=7)
    draws = [HostSampler(config).choose(logits) for _ in range(2)]
    assert draws[0] == draws[1] and draws[0] in (0, 1, 2)


@pytest.mark.parametrize(
    "field, value",
    [
        ("top_k", -1),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
    ],
)
def test_range_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        SamplingConfig(**{field: value})


@pytest.mark.parametrize("backend", BACKENDS)
def test_driver_samples_through_the_host_sampler(tiny_checkpoint, backend):
    """Decoding with every setting on equals a host loop: full forward of the growing sequence, then
    HostSampler with the same seed (so the same random draws)."""
    model = load(backend, tiny_checkpoint("llama", "gguf"))
    ids = prompt(40, model.args.vocab_size, seed=5)
    config = SamplingConfig(
        temperature=0.8,
        top_p=0.9,
        seed=11,
        top_k=20,
        min_p=0.02,
        repetition_penalty=1.3,
        presence_penalty=0.4,
        frequency_penalty=0.2,
    )
    got = list(
        model.generate_step(
            ids, max_tokens=12, sampling=config, stop_ids=frozenset(), method=PrefillMethod(), info=GenerationInfo()
        )
    )
    reference, sequence = HostSampler(config, ids), list(ids)
    for _ in range(12):
        sequence.append(reference.choose(model.ops.to_numpy(model(sequence))[0, -1]))
    assert got == sequence[len(ids) :]
    greedy = list(
        model.generate_step(
            ids,
            max_tokens=12,
            sampling=SamplingConfig(repetition_penalty=1.5),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )
    )
    plain = list(
        model.generate_step(
            ids,
            max_tokens=12,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )
    )
    assert greedy != plain  # the penalty changes the greedy text of a random model


def test_drafting_with_host_settings_is_refused(tiny_checkpoint):
    """Checked where the request is made (core/request.build_request), so the API refuses it too."""
    from specfill.api import generate, load

    model, tokenizer = load("random:tiny-llama", backend="cuda", device="cpu")
    with pytest.raises(ConfigError, match="top_k, min_p or a penalty"):
        generate(model, tokenizer, [1, 2, 3], 2, top_k=3, draft_model="self:1", num_draft_tokens=2)
