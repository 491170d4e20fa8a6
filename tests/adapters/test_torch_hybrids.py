"""Hybrid transformers models (recurrent layers beside attention layers) through the adapter: the
cache holds specfill's KV for the attention layers and transformers' own linear-attention state
(conv + SSM / delta-rule state) for the others (backends/torch_cuda/hybrid_cache.py, its books in
core/hybrid.py); docs/methods.md, Hybrid models.

Forward and decoding equal transformers' own model (float32 on the CPU) to STEPPED_TOLERANCE where
the prefill runs in steps: transformers' chunked delta rule / SSM scan sums a prompt cut in two
steps in another order than in one (observed up to 1.5e-5 x max|logit| on qwen3_5_text, 40 tokens
in steps of 24 + 16; a wrong state or position changes logits by > 1e-2 x max|logit|); drafting
rolls the recurrent state back (snapshot + replay) and gives the plain greedy tokens; H2O's memory
sets and outputs and SpecPrefill's kept positions equal the NumPy oracle / reference on the
attention layers (the four-layer configs below: two of each kind)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from specfill.core import H2OConfig  # noqa: E402
from specfill.core.adapted import MethodRefusedError  # noqa: E402
from specfill.core.errors import ConfigError  # noqa: E402
from specfill.core.hybrid import HISTORY  # noqa: E402
from specfill.core.methods.h2o import H2OPrefillAttention  # noqa: E402
from specfill.core.methods.specprefill import QueryCapture  # noqa: E402
from specfill.core.reference import REFERENCE  # noqa: E402
from specfill.core.reference.oracle import oracle_h2o_layer  # noqa: E402
from specfill.core.reference.specprefill import speculative_selection  # noqa: E402
from specfill.core.runtime import Drafting, GenerationInfo, KVState, PrefillMethod, SamplingConfig  # noqa: E402
from tests.adapters.support import H2O, assert_close, greedy, prompt, record, spec  # noqa: E402
from tests.adapters.torch_archs import HYBRID, build  # noqa: E402
from tests.adapters.torch_backend import adapted, own_greedy, own_logits, to_numpy  # noqa: E402

FIRST = tuple(sorted(HYBRID))  # the method tests' architectures: every honoured hybrid
RECURRENT = {"nemotron_h": (0, 3), "falcon_h1": (0, 1, 2, 3)}  # else (0, 2)
ATTENTION = {"nemotron_h": (1, 4), "falcon_h1": (0, 1, 2, 3)}  # else (1, 3)
STEPPED_TOLERANCE = 5e-5  # x max(1, max|logit|): the module doc


def four_layers(arch: str, seed: int = 0):
    """The hybrid with two attention layers: recurrent, attention, recurrent, attention (Nemotron-H:
    Mamba, attention, MLP, Mamba, attention, MoE; Falcon-H1: four parallel layers)."""
    extra = dict(HYBRID[arch], num_hidden_layers=4)
    if arch == "lfm2":
        extra["full_attn_idxs"] = [1, 3]
    if arch == "granitemoehybrid":
        extra["layer_types"] = ["mamba", "attention"] * 2
    if arch in ("kimi_linear", "minimax"):
        extra["layer_types"] = ["linear_attention", "full_attention"] * 2
    if arch == "nemotron_h":
        extra.update(num_hidden_layers=6, layers_block_type=["mamba", "attention", "mlp", "mamba", "attention", "moe"])
    return build(arch, extra, seed=seed)


@pytest.mark.parametrize("arch", sorted(HYBRID))
def test_full_prefill_and_decoding_equal_transformers(arch):
    """Every position's logits over two prefill steps (the second reads both kinds of state), then
    greedy decoding: equal to transformers' forward and its own cache."""
    lm = four_layers(arch)
    ids = prompt(40, seed=1)
    want, want_tokens = own_logits(lm, ids), own_greedy(lm, ids[:20], 6, positions=arch == "minimax")
    model = adapted(lm, prefill_step_size=24)
    assert model.args.recurrent_layers == RECURRENT.get(arch, (0, 2))
    assert model.args.attention_layers == ATTENTION.get(arch, (1, 3))
    assert model.args.refusal() is None
    got = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= STEPPED_TOLERANCE * max(1.0, float(np.abs(want).max())), arch
    assert greedy(model, ids[:20], 6) == want_tokens


def test_jamba_continues_its_ssm_state_token_by_token_and_not_otherwise():
    """transformers' Jamba mixer starts a step of several tokens from a zero SSM state: specfill runs
    such a step token by token once the state is non-empty (adapted.stepwise_mixers). Without it the
    stepped logits leave the tolerance (this check can fail); with it they are within it (above)."""
    lm = four_layers("jamba")
    ids = prompt(40, seed=1)
    want = own_logits(lm, ids)
    bound = STEPPED_TOLERANCE * max(1.0, float(np.abs(want).max()))
    model = adapted(lm, prefill_step_size=24)
    assert len(model.model.stepwise) == 2  # the Mamba mixers of layers 0 and 2
    model.model.stepwise = ()
    wrong = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert float(np.abs(wrong[24:] - want[24:]).max()) > 100 * bound


@pytest.mark.parametrize("arch", sorted(HYBRID))
def test_a_prompt_cache_continuation_equals_a_cold_run(arch):
    """The cache of a first request (20 prompt tokens + 4 generated), reused at a decode step's
    snapshot (21 slots): the next prompt's 11 new tokens continue both kinds of state in one step."""
    model = adapted(four_layers(arch))
    ids = prompt(32, seed=2)
    info = GenerationInfo()
    first = greedy(model, ids[:20], 4, info=info)
    extended = ids[:20] + first + ids[24:]
    reuse = KVState(info.kv.cache, 21)
    options = dict(sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod(), info=GenerationInfo())
    assert list(model.generate_step(extended, max_tokens=4, reuse=reuse, **options)) == greedy(model, extended, 4)


@pytest.mark.parametrize("arch", sorted(HYBRID))
def test_drafting_rolls_the_recurrent_state_back_and_gives_the_greedy_tokens(arch):
    """A draft model of other weights (most drafts rejected: the main model's verification step is
    undone and its accepted tokens replayed; the draft's own steps undone), and "self:1" (a draft of
    the first layer, its writes undone each round)."""
    model = adapted(four_layers(arch))
    ids = prompt(20, seed=12)
    plain = greedy(model, ids, 10)
    other = adapted(four_layers(arch, seed=3))
    for draft in (other, "self:1"):
        info = GenerationInfo()
        assert greedy(model, ids, 10, info=info, drafting=Drafting(draft, 3)) == plain, f"{arch} {draft}"
        if draft is other:
            assert info.decode.accepted_tokens < info.decode.drafted_tokens  # rollbacks happened


@pytest.mark.parametrize("arch", ["qwen3_5_text", "nemotron_h", "falcon_h1"])
def test_the_speculator_drafts_after_specprefill_with_its_state_rolled_back(arch):
    """The SpecPrefill speculator (a view of the model's first layers, or a hybrid of other weights)
    continues from its prompt cache as the draft, every round (a fixed length): plain tokens."""
    model, ids = adapted(four_layers(arch)), prompt(40, seed=3)
    for speculator in ("self:3", adapted(four_layers(arch, seed=7))):
        method = replace(spec(0.5), speculator=speculator)
        info = GenerationInfo()
        got = greedy(model, ids, 10, method, info, drafting=Drafting(None, 3, adaptive=False))
        assert got == greedy(model, ids, 10, method) and info.decode.accepted_tokens < info.decode.drafted_tokens


@pytest.mark.parametrize("arch", FIRST)
def test_h2o_runs_on_the_attention_layers_and_equals_the_oracle(arch, monkeypatch):
    model = adapted(four_layers(arch))
    ids = prompt(36, seed=7)
    calls = record(monkeypatch, H2OPrefillAttention, to_numpy)
    info = GenerationInfo(record_memory=True)
    model.prompt_logits(ids, method=H2O, info=info)
    attention = ATTENTION.get(arch, (1, 3))
    assert tuple(sorted({call[0] for call in calls})) == attention  # the others run as transformers'
    config = H2O.h2o
    for layer, q, k, v, out in calls:
        want_out, want_sets, _ = oracle_h2o_layer(
            q, k, v, config.chunk_size, config.local, config.heavy, model.args.layers[layer].scale
        )
        assert_close(out, want_out.astype(np.float32), f"{arch} layer {layer} H2O output")
        for chunk, (got, want) in enumerate(zip(info.memory_sets[layer], want_sets)):
            np.testing.assert_array_equal(got, np.array(want), err_msg=f"{arch} layer {layer} M_{chunk}")
    counts = [len(sets) for sets in info.memory_sets]
    assert counts == [36 // 8 if i in attention else 0 for i in range(len(counts))]


@pytest.mark.parametrize("arch", FIRST)
def test_specprefill_scores_the_attention_layers_and_equals_the_reference(arch, monkeypatch):
    """The speculator (the model's first three layers) scores from its attention layers only; the
    main model prefills the kept tokens through every layer at their original positions."""
    model = adapted(four_layers(arch))
    ids = prompt(48, seed=8)
    calls = record(monkeypatch, QueryCapture, to_numpy)
    info = GenerationInfo()
    method = replace(spec(0.3), speculator="self:3")
    tokens = greedy(model, ids, 3, method, info)
    n = len(ids)
    scored = [i for i in ATTENTION.get(arch, (1, 3)) if i < 3]  # the speculator's attention layers
    assert sorted({call[0] for call in calls}) == scored
    queries = np.stack([[q[:, -1] for i, q, k, _, _ in calls if i == layer and k.shape[1] >= n] for layer in scored])
    keys = np.stack([next(k for i, _, k, _, _ in calls if i == layer)[:, :n] for layer in scored])
    _, selection = speculative_selection(
        queries.astype(np.float64),
        keys.astype(np.float64),
        method.specprefill,
        model.args.attention_scale,
        REFERENCE,
        (None,) * len(scored),
        (None,) * len(scored),
    )
    assert info.kept_positions == selection.kept.tolist() and 8 <= info.kept_tokens < n
    assert len(tokens) == 3 and greedy(model, ids, 4, replace(method, specprefill=spec(1.0).specprefill)) == greedy(
        model, ids, 4
    )


def test_more_drafts_than_the_cache_can_roll_back_is_one_config_error():
    model = adapted(four_layers("qwen3_5_text"))
    with pytest.raises(ConfigError, match=f"num_draft_tokens {HISTORY - 1} exceeds {HISTORY - 2}"):
        greedy(model, prompt(20), 4, drafting=Drafting("self:2", HISTORY - 1))


def test_a_speculator_without_attention_layers_is_refused_by_name():
    model = adapted(four_layers("qwen3_5_text"))
    with pytest.raises(MethodRefusedError, match="speculator cannot run on qwen3_5_text: its layers are all recurrent"):
        greedy(model, prompt(24), 2, spec(0.3))  # self:1: the first layer only, a recurrent one


@torch.inference_mode()  # as the driver runs its steps
def test_the_cache_goes_back_only_to_the_points_it_kept():
    """truncate restores a snapshot (a clone: transformers writes its state in place) and replays
    the tokens after it; a slot count with no snapshot at or below it is refused; exact_prefix and
    copy name and take only those points."""
    model = adapted(four_layers("qwen3_5_text"))
    ops, ids = model.ops, prompt(30, seed=4)
    cache = ops.new_cache(model.model, 64)
    ops.forward(model.model, ops.tokens(ids[:20]), 0, cache, None, None)
    cache.mark()
    ops.forward(model.model, ops.tokens(ids[20:28]), 20, cache, None, None)
    assert cache.exact_prefix(27) == 20 and cache.exact_prefix(28) == 28 and cache.exact_prefix(19) == 0
    with pytest.raises(ValueError, match="keeps no recurrent state at slot 24"):
        cache.copy(24)
    copied = cache.copy(20, 64)
    cache.truncate(24)  # from the step snapshot at 20, then 4 tokens replayed
    want = model.prompt_logits(ids[:25], method=PrefillMethod(), info=GenerationInfo())[-1]
    got = ops.forward(model.model, ops.tokens(ids[24:25]), 24, cache, None, 0)[-1]
    assert_close(to_numpy(got), want, "after the replay")
    for _ in range(2):  # the mark is restored twice: each restore is a clone of it
        cache.truncate(20)
        got = ops.forward(model.model, ops.tokens(ids[20:25]), 20, cache, None, 0)[-1]
        assert_close(to_numpy(got), want, "from the mark")
    got = ops.forward(model.model, ops.tokens(ids[20:25]), 20, copied, None, 0)[-1]
    assert_close(to_numpy(got), want, "from the copy at the mark")
    fresh = ops.new_cache(model.model, 64)
    ops.forward(model.model, ops.tokens(ids[:20]), 0, fresh, None, None)
    fresh.history.clear()
    with pytest.raises(ValueError, match="cannot go back to 10"):
        fresh.truncate(10)


def test_a_reuse_where_the_cache_kept_no_recurrent_state_is_one_config_error():
    model = adapted(four_layers("qwen3_5_text"))
    ids = prompt(30, seed=2)
    info = GenerationInfo()
    first = greedy(model, ids[:20], 4, info=info)  # marks slot 20; steps at 20..22 in its history
    extended = ids[:20] + first + ids[24:]

    def run(slots: int) -> list[int]:
        reuse = KVState(info.kv.cache, slots)
        options = dict(sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod(), info=GenerationInfo())
        return list(model.generate_step(extended, max_tokens=3, reuse=reuse, **options))

    with pytest.raises(ConfigError, match="cannot be cut to 12 slots: its recurrent state is kept at 0"):
        run(12)
    assert run(21) == greedy(model, extended, 3)  # a step snapshot: exact


@torch.inference_mode()
def test_a_step_stopped_between_layers_is_undone_on_every_layer(monkeypatch):
    """A cancelled request stops a step between layers (some recurrent layers have read its tokens,
    the attention layers not): the next truncate restores the state before it."""
    from specfill.backends.torch_cuda import adapter

    model = adapted(four_layers("qwen3_5_text"))
    ops, ids = model.ops, prompt(24, seed=5)
    cache = ops.new_cache(model.model, 64)
    ops.forward(model.model, ops.tokens(ids[:16]), 0, cache, None, None)
    original = adapter.specfill_attention

    def stop(module, *args, **kwargs):
        if adapter.ACTIVE.get().index[id(module)] == 3:
            raise KeyboardInterrupt("cancelled")
        return original(module, *args, **kwargs)

    from transformers import AttentionInterface

    AttentionInterface.register(adapter.NAME, stop)
    try:
        with pytest.raises(KeyboardInterrupt):  # layers 0-2 have read ids[16:20], layer 3 stops
            ops.forward(model.model, ops.tokens(ids[16:20]), 16, cache, None, None)
    finally:
        AttentionInterface.register(adapter.NAME, original)
    assert cache.exact_prefix(20) == 16  # the stopped step's tokens are not a prefix it holds
    cache.truncate(16)
    got = ops.forward(model.model, ops.tokens(ids[16:24]), 16, cache, None, 0)[-1]
    want = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())[-1]
    assert_close(to_numpy(got), want, "after the stopped step")


def test_auto_calibrates_a_hybrid_whose_first_layer_is_recurrent(tmp_path, monkeypatch):
    """auto's probe times the first layers up to the first attention layer (core/probe.timed_layers):
    a one-layer view of qwen3_5_text (layer 0 a delta-net) has no keys for H2O or the scoring."""
    from specfill.core import crossover, probe

    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path))
    model = adapted(four_layers("qwen3_5_text"))
    assert probe.timed_layers(model.args) == 2
    small = H2OConfig(chunk_size=8, batch_size=8, local=2, heavy=2)
    for method in (PrefillMethod("auto", h2o=small), PrefillMethod("auto", speculator="self:2")):
        value, source = probe.auto_crossover(model, method, lengths=[32, 64])
        assert source.startswith("calibrated now"), source
        data = json.loads(crossover.calibration_path(probe.key_for(model, method)).read_text())
        assert all(p["full_s"] > 0 and p["sparse_s"] > 0 for p in data["points"].values())
