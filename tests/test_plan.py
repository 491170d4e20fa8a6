"""A generation's plan (core/plan.py): every choice made and checked against the model and the
prompt once, before any model runs; the driver only runs it."""

from __future__ import annotations

import dataclasses

import pytest

from specfill.core import ConfigError, PromptTooLongError, SpecPrefillConfig
from specfill.core.plan import plan_generation
from specfill.core.runtime import Drafting, GenerationInfo, KVState, PrefillMethod, SamplingConfig

IDS = list(range(1, 41))


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    from specfill.api import load

    return load(str(tiny_checkpoint("llama", "gguf")), backend="cuda", device="cpu", dtype="float32")[0]


def _plan(model, ids=IDS, max_tokens=4, **kw):
    parts = {"sampling": SamplingConfig(), "stop_ids": frozenset(), "method": PrefillMethod(), "info": GenerationInfo()}
    return plan_generation(model, ids, max_tokens=max_tokens, **{**parts, **kw})


def test_the_plan_resolves_the_method_the_speculator_and_the_room(model):
    """auto with a threshold resolves on the prompt's length; SpecPrefill gets its speculator (self:K:
    the main model's step) and its settings fitted to the prompt; the room after the prompt counts a
    drafted round's tokens; info says the method that will run."""
    info = GenerationInfo()
    auto = PrefillMethod("auto", auto_threshold=30, speculator="self:1", specprefill=SpecPrefillConfig())
    plan = _plan(model, method=auto, info=info)
    assert plan.method.name == "specprefill" and info.method == "specprefill"
    assert plan.speculator is not None and plan.speculator[1] == model.prefill_step_size
    assert plan.method.specprefill.select_chunk == 32  # fits the 40-token prompt: kept as given
    wide = PrefillMethod("specprefill", specprefill=SpecPrefillConfig(select_chunk=64), speculator="self:1")
    assert _plan(model, method=wide).method.specprefill.select_chunk == len(IDS)  # clamped to the prompt
    assert _plan(model, ids=IDS[:20], method=auto).method.name == "full"
    assert _plan(model).extra_slots == 4
    drafted = _plan(model, drafting=Drafting("self:1", 2, adaptive=False))
    assert drafted.extra_slots == 4 + 3 and drafted.draft is not None and drafted.book is None


def test_what_the_model_refuses_is_refused_before_any_model_runs(model):
    """generate_step raises at the call, not at the first token: ids outside the vocabulary, a prompt
    past the context, a speculator of another backend, a reused speculator KV of another shape."""
    run = {"max_tokens": 2, "sampling": SamplingConfig(), "stop_ids": frozenset(), "info": GenerationInfo()}
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        model.generate_step([1, 10**6], method=PrefillMethod(), **run)
    with pytest.raises(PromptTooLongError):
        model.generate_step(IDS, **{**run, "max_tokens": model.args.max_position_embeddings}, method=PrefillMethod())
    with pytest.raises(ConfigError, match="must be a model loaded on the cuda backend or 'self:K'"):
        model.generate_step(IDS, method=PrefillMethod("specprefill", speculator=object()), **run)

    info = GenerationInfo()
    list(model.generate_step(IDS[:20], method=PrefillMethod(), **{**run, "info": info}))
    assert info.kv is not None and len(info.kv.cache.layers) == 2
    reuse = dataclasses.replace(info.kv, speculator=KVState(info.kv.cache, 20))  # a 2-layer KV for self:1
    spec = PrefillMethod("specprefill", specprefill=SpecPrefillConfig(), speculator="self:1")
    with pytest.raises(ConfigError, match="layers, not the speculator's"):
        model.generate_step(IDS, method=spec, reuse=reuse, **run)
