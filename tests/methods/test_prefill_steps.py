"""Every method's prefill goes in steps, reports each (core/methods/prefill.py StageProgress) and
stops at the first report after a cancellation: full prefill per `prefill_step_size`, H2O per
group of whole chunks, SpecPrefill per speculator step, look-ahead token and main-prefill step.
The server's disconnect and shutdown handling rest on this (specfill/serve/engine.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.methods.h2o import h2o_step_size
from specfill.core.methods.prefill import PrefillStep
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import greedy, prompt, variant

N = 70  # prompt tokens; steps of 32: 32, 64, 70
H2O = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=16, batch_size=64, local=3, heavy=3, dense_tail=5))
SPEC = PrefillMethod(
    "specprefill",
    speculator="self:1",
    specprefill=SpecPrefillConfig(keep_ratio=0.2, lookahead=4, select_chunk=8, pool_kernel=3),
)
PROMPT_STEPS = [PrefillStep("prefill", 32, N), PrefillStep("prefill", 64, N), PrefillStep("prefill", N, N)]


class Cancelled(Exception):
    """What the server's progress callback raises for a client that left."""


def run(t, method: PrefillMethod, step: int = 32, cancel_at_forward: int | None = None, monkeypatch=None):
    """Generate 2 tokens; returns (the public (processed, total) calls, the stage steps, the number
    of model forwards (speculator's included) up to the end of the prefill or the cancellation).
    cancel_at_forward f: the request is cancelled while forward f runs (a disconnect mid-step)."""
    model = variant(t, prefill_step_size=step)
    info, calls, steps, forwards, cancelled = GenerationInfo(), [], [], [0], [False]
    if monkeypatch is not None:
        inner = model.ops.forward

        def counting(*args):
            forwards[0] += 1
            cancelled[0] = cancelled[0] or forwards[0] == cancel_at_forward
            return inner(*args)

        monkeypatch.setattr(model.ops, "forward", counting)

    def progress(done: int, total: int) -> None:
        calls.append((done, total))
        steps.append(info.step)
        if cancelled[0]:
            raise Cancelled

    try:
        greedy(model, prompt(N, t.args.vocab_size, seed=3), 2, method, info=info, progress=progress)
    except Cancelled:
        return calls, steps, forwards[0]
    return calls, steps, None


def test_full_and_h2o_report_every_step(tiny):
    t = tiny("qwen2")
    for method in (PrefillMethod(), H2O):
        calls, steps, _ = run(t, method)
        assert calls == [(32, N), (64, N), (N, N)], method.name
        assert steps == PROMPT_STEPS, method.name


def test_h2o_steps_are_whole_chunks_within_a_logical_batch():
    config = H2OConfig(chunk_size=16, batch_size=64, local=3, heavy=3)
    assert [h2o_step_size(config, s) for s in (1, 16, 31, 32, 50, 64, 2048)] == [16, 16, 16, 32, 48, 64, 64]


def test_specprefill_reports_the_speculator_lookahead_and_main_prefill_steps(tiny):
    t = tiny("qwen3")
    info = GenerationInfo()
    greedy(variant(t, prefill_step_size=32), prompt(N, t.args.vocab_size, seed=3), 2, SPEC, info=info)
    kept = info.kept_tokens  # 2 chunks of 8 and the last token: 17 (one main-prefill step of 32)
    calls, steps, _ = run(t, SPEC)
    assert kept == 17
    assert steps == [
        PrefillStep("speculator", 32, N),
        PrefillStep("speculator", 64, N),
        PrefillStep("speculator", N, N),
    ] + [PrefillStep("lookahead", i, 4) for i in (1, 2, 3, 4)] + [PrefillStep("main_prefill", kept, kept)]
    assert calls == [(32, N), (64, N)] + [(N, N)] * 6  # monotone, on the prompt's scale


def test_prefill_done_covers_every_stage_weighted_by_expected_work(tiny):
    """info.prefill_done (what the CLI's bar shows) rises with every step of every stage and
    reaches 1 only at the main prefill's last step: the speculator's pass, the look-ahead and the
    main prefill each take their expected work's share (expected_work), not the whole bar."""
    from specfill.core.methods.specprefill import expected_work

    t = tiny("qwen3")
    info, seen = GenerationInfo(), []
    greedy(
        variant(t, prefill_step_size=32),
        prompt(N, t.args.vocab_size, seed=3),
        2,
        SPEC,
        info=info,
        progress=lambda done, total: seen.append((info.step.stage, info.prefill_done)),
    )
    shares = [done for _, done in seen]
    assert shares == sorted(shares) and len(set(shares)) == len(shares) and shares[-1] == pytest.approx(1.0)
    work = expected_work(t.args, replace(t.args, num_hidden_layers=1), N, SPEC.specprefill)
    speculator_end = max(done for stage, done in seen if stage == "speculator")
    assert speculator_end == pytest.approx(work["speculator"] / sum(work.values()))
    assert 0 < speculator_end < max(done for stage, done in seen if stage == "lookahead") < 1
    full = GenerationInfo()
    greedy(variant(t, prefill_step_size=32), prompt(N, t.args.vocab_size, seed=3), 2, PrefillMethod(), info=full)
    assert full.prefill_done == 1.0  # one stage: the prompt read


@pytest.mark.parametrize("method", [PrefillMethod(), H2O, SPEC], ids=["full", "h2o", "specprefill"])
def test_a_cancellation_stops_the_prefill_within_one_step(tiny, monkeypatch, method):
    """Cancelled while forward f runs: that step ends, its report raises, no other forward starts."""
    t = tiny("qwen2")
    events = len(run(t, method)[0])
    assert events == (8 if method.name == "specprefill" else 3)
    for f in range(1, events + 1):
        calls, _, forwards = run(t, method, cancel_at_forward=f, monkeypatch=monkeypatch)
        assert forwards == f and len(calls) == f, f"cancelled in forward {f}: {forwards} forwards, {len(calls)} reports"


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_h2o_logits_do_not_depend_on_the_step(tiny):
    """Steps and logical batches only schedule work: bitwise the same logits in float32 on torch
    (the dense tail's blocks sit on the chunk grid, so no step boundary splits one). H2O in every
    layer: a layer outside config.layers is full prefill's attention, whose rounding may follow the step."""
    t = tiny("llama")
    ids = prompt(150, t.args.vocab_size, seed=5)
    runs = []
    for step, batch in ((16, 64), (32, 64), (48, 160), (2048, 160)):
        method = PrefillMethod(
            "h2o", h2o=H2OConfig(chunk_size=16, batch_size=batch, local=3, heavy=3, dense_tail=21, layers="all")
        )
        runs.append(variant(t, prefill_step_size=step).prompt_logits(ids, method=method, info=GenerationInfo()))
    for got in runs[1:]:
        np.testing.assert_array_equal(got, runs[0])
