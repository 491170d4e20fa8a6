"""A cancellation check (core/ops.py `cancellation`) stops a generation inside a prefill step, before the next
layer (the speculator's too) or H2O chunk, on every backend; a check that never fires changes
nothing; and a reused KV cache a cancelled step left with some layers ahead is cut back on every
layer before it is extended again (the server's prompt cache puts it back after a disconnect)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specfill.core.ops import Cancelled, cancellation, installed
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from tests.methods.support import greedy, prompt, variant
from tests.methods.test_prefill_steps import H2O, SPEC, N

METHODS = [PrefillMethod(), H2O, replace(SPEC, speculator="self:2")]  # a speculator of 2 layers


class Check:
    """An installed check that counts its calls and answers True from call `fire_at` on."""

    def __init__(self, fire_at: int | None = None):
        self.fire_at, self.calls = fire_at, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.fire_at is not None and self.calls >= self.fire_at


def run(model, method: PrefillMethod, check: Check) -> tuple[list[int] | None, list[int]]:
    """(the 2 greedy tokens, or None when cancelled; the check's call count at each step's report)."""
    reports: list[int] = []
    try:
        with cancellation(check):
            return greedy(
                model,
                prompt(N, model.args.vocab_size, seed=3),
                2,
                method,
                progress=lambda done, total: reports.append(check.calls),
            ), reports
    except Cancelled:
        return None, reports


@pytest.mark.parametrize("method", METHODS, ids=["full", "h2o", "specprefill"])
def test_a_cancel_stops_inside_the_step_in_flight(tiny, method):
    """Cancelled at the second check of step 2: step 2 never reports, no check (so no layer and
    no chunk) runs after it, and the first step's work was checked more than once (per layer)."""
    model = variant(tiny("qwen2"), prefill_step_size=32)
    tokens, reports = run(model, method, Check())
    assert tokens is not None and len(reports) >= 3
    first, second = reports[0], reports[1]
    assert first >= model.args.num_hidden_layers and second - first >= model.args.num_hidden_layers
    check = Check(fire_at=first + 2)
    tokens, stopped = run(model, method, check)
    assert tokens is None and stopped == reports[:1], (method.name, stopped, reports)
    assert check.calls == first + 2


@pytest.mark.parametrize("method", METHODS, ids=["full", "h2o", "specprefill"])
def test_a_check_that_never_fires_changes_nothing(tiny, method):
    """Same tokens with an installed check (MLX then evaluates each layer of a step on its own)."""
    model = variant(tiny("llama"), prefill_step_size=32)
    plain = greedy(model, prompt(N, model.args.vocab_size, seed=3), 2, method)
    checked, _ = run(model, method, Check())
    assert checked == plain and not installed()


def test_a_reused_cache_left_mid_step_is_cut_back_on_every_layer(tiny):
    """Turn 2 reuses 10 slots of turn 1's cache (room enough: no grown copy) and is cancelled before
    layer 2 of its step (layer 1 is then 25 slots ahead); turn 2 again from the same cache samples
    what a fresh run samples, with every layer holding the same slots."""
    model = variant(tiny("llama"), prefill_step_size=32)
    turn1 = prompt(40, model.args.vocab_size, seed=4)
    info = GenerationInfo()
    greedy(model, turn1, 3, info=info)
    held = KVState(info.kv.cache, 10)
    turn2 = turn1[:10] + prompt(25, model.args.vocab_size, seed=5)
    with pytest.raises(Cancelled), cancellation(Check(fire_at=2)):
        sample(model, turn2, held)
    assert offsets(held.cache)[0] == 35 and offsets(held.cache)[1:] == [10] * (model.args.num_hidden_layers - 1)
    again, fresh = GenerationInfo(), GenerationInfo()
    assert sample(model, turn2, held, again) == sample(model, turn2, None, fresh)
    assert offsets(again.kv.cache) == offsets(fresh.kv.cache)


def sample(model, ids: list[int], reuse: KVState | None, info: GenerationInfo | None = None) -> list[int]:
    """3 tokens sampled with a seed (sampling reads the whole distribution, not only its top)."""
    return list(
        model.generate_step(
            ids,
            max_tokens=3,
            sampling=SamplingConfig(temperature=1.0, seed=3),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=info or GenerationInfo(),
            reuse=reuse,
        )
    )


def offsets(cache) -> list[int]:
    """Filled slots of every layer (core/ops.py's KVCache: one LayerCache per layer)."""
    return [layer.offset for layer in cache.layers]
