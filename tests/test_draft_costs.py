"""A draft model's step costs remembered per machine (core/methods/draft_costs.py): the prediction
skips drafting where the measured costs say it cannot pay and drafts where it can, a file of another
machine or a corrupt one is never used, and through the driver a skipped decode is plain greedy
decoding without the draft's prefill, reported, while a fixed schedule and seeded sampling ignore it."""

from __future__ import annotations

import json

import pytest

from specfill.core.crossover import calibration_path
from specfill.core.methods.draft_costs import CostBook, cost_key
from specfill.core.methods.draft_length import DraftLength
from specfill.core.models import ModelArgs
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig
from tests.fixtures.reference_runs import prompt


def measured(plain: float, draft: float, verify5: float) -> DraftLength:
    """A DraftLength after a plain round and one round of 4 drafts with these step times (seconds)."""
    length = DraftLength(4)
    length.record(0, 0, 0.0, plain)
    length.record(4, 4, 4 * draft, verify5)
    return length


def book_for(model, draft, max_k: int = 4) -> CostBook:
    """The book the driver keeps for `model` drafted by `draft` (torch, CPU, float32)."""
    return CostBook(
        cost_key(
            backend=model.backend,
            device=model.device_name,
            dtype="float32",
            threads=model.ops.compute_threads,
            main=model.args,
            draft=draft.args,
        ),
        max_k,
    )


def tiny_book(tmp_path, monkeypatch) -> CostBook:
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path))
    args = ModelArgs(
        architecture="llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    key = cost_key(backend="cuda", device="cpu", dtype="float32", threads=1, main=args, draft=args)
    return CostBook(key, 4)


def test_nothing_remembered_drafts(tmp_path, monkeypatch):
    assert tiny_book(tmp_path, monkeypatch).skip_reason(500, 64) == ""


def test_an_expensive_draft_is_skipped_and_a_cheap_one_drafts(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    # AVX2 fp32 pair: draft step half a plain step, verify of 5 rows 2.3 plain steps, 69% accepted
    book.remember(measured(0.5, 0.27, 1.15), prefill_seconds=8.0, prompt_tokens=500, drafted=13, accepted=9)
    reason = book.skip_reason(500, 64)
    assert reason.startswith("drafting skipped: the step costs measured on this machine")
    assert "acceptance 0.69" in reason
    # a bf16 GPU-like pair: draft step a tenth, verify nearly flat, 90% accepted: drafting pays
    book.remember(measured(0.1, 0.01, 0.11), prefill_seconds=0.5, prompt_tokens=500, drafted=40, accepted=36)
    assert book.read()["acceptance"] == pytest.approx(0.5 * 9 / 13 + 0.5 * 0.9, abs=1e-4)
    assert book.skip_reason(500, 64) == ""
    assert book.skip_reason(500, 1) == ""  # one token: no decode step to draft for


def test_the_draft_prefill_alone_can_make_it_not_pay(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    book.remember(measured(0.1, 0.01, 0.11), prefill_seconds=0.5, prompt_tokens=500, drafted=4, accepted=4)
    assert book.skip_reason(500, 64) == ""
    assert "with the draft model's prompt prefill" in book.skip_reason(500_000, 64)  # 500 s of prefill


def test_another_machines_or_a_corrupt_file_is_never_used(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    book.remember(measured(0.5, 0.5, 2.5), prefill_seconds=8.0, prompt_tokens=500, drafted=4, accepted=1)
    assert book.skip_reason(500, 64) != ""
    path = calibration_path(book.key)
    saved = path.read_text()
    data = json.loads(saved)
    data["key"]["machine"]["cpu"] = "another CPU"
    path.write_text(json.dumps(data))
    assert book.read() is None and book.skip_reason(500, 64) == ""
    for costs in ({"plain_step": 0.0}, {"draft_step": float("nan")}, {"acceptance": "high"}, {"verify": []}):
        good = json.loads(saved)
        good["costs"].update(costs)
        path.write_text(json.dumps(good))
        assert book.read() is None, costs
    path.write_text("{not json")
    assert book.read() is None


def test_kept_costs_seed_the_draft_length_and_new_measurements_join_them(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    fresh = DraftLength(4)
    book.seed(fresh)  # nothing kept: nothing seeded
    assert fresh.verify == {} and fresh.draft_step is None
    book.remember(measured(0.5, 0.26, 0.75), prefill_seconds=4.0, prompt_tokens=500, drafted=4, accepted=4)
    seeded = DraftLength(4)
    book.seed(seeded)
    assert seeded.verify == {1: 0.5, 5: 0.75} and seeded.draft_step == 0.26
    assert seeded.acceptance == 0.75  # the prior: acceptance belongs to the prompt, not the machine
    slow_first = DraftLength(4)
    for length in (slow_first, seeded):  # a plain round, then a first 5-row verify twice as slow
        length.record(0, 0, 0.0, 0.5)
        length.record(4, 4, 4 * 0.26, 1.5)
    assert seeded.verify[5] == 0.75 and slow_first.verify[5] == 1.5
    assert seeded.rate(3) > slow_first.rate(3)


def test_nothing_is_kept_without_a_measured_draft_step(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    plain_only = DraftLength(4)
    plain_only.record(0, 0, 0.0, 0.5)
    book.remember(plain_only, prefill_seconds=1.0, prompt_tokens=100, drafted=0, accepted=0)
    assert not calibration_path(book.key).exists()


def test_a_skipped_decode_is_plain_greedy_without_the_draft_prefill(tiny_checkpoint):
    from specfill.backends.torch_cuda import load

    main = load(tiny_checkpoint("llama", "gguf"), dtype="float32", device="cpu")[0]
    draft = load(tiny_checkpoint("qwen3", "safetensors"), dtype="float32", device="cpu")[0]
    ids = prompt(60, main.args.vocab_size, seed=31)

    def run(drafting, sampling=SamplingConfig()):
        info = GenerationInfo()
        tokens = list(
            main.generate_step(
                ids,
                max_tokens=12,
                sampling=sampling,
                stop_ids=frozenset(),
                method=PrefillMethod(),
                info=info,
                drafting=drafting,
            )
        )
        return tokens, info.decode

    plain, _ = run(None)
    tokens, record = run(Drafting(draft, 4))  # nothing remembered yet: it drafts, then keeps its costs
    assert tokens == plain and record.drafted_tokens > 0 and record.skipped == ""
    book = book_for(main, draft)
    assert book.read() is not None
    book.remember(measured(0.001, 0.01, 0.01), prefill_seconds=1.0, prompt_tokens=60, drafted=4, accepted=1)
    tokens, record = run(Drafting(draft, 4))
    assert tokens == plain and record.skipped.startswith("drafting skipped")
    assert record.drafted_tokens == 0 and "draft_prefill" not in record.seconds
    tokens, record = run(Drafting(draft, 4, adaptive=False))  # the fixed schedule drafts as asked
    assert tokens == plain and record.drafted_tokens > 0 and record.skipped == ""
    seeded = SamplingConfig(temperature=0.8, seed=3)
    book.remember(measured(0.001, 0.01, 0.01), prefill_seconds=1.0, prompt_tokens=60, drafted=4, accepted=1)
    _, record = run(Drafting(draft, 4), seeded)  # a seeded sampling run never reads the clock's book
    assert record.skipped == "" and record.drafted_tokens > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decode_through_the_api_keeps_its_costs(tiny_checkpoint, calibration_cache, dtype):
    """The API stops reading the driver's steps at the last token (finish set), so the costs must be
    kept before that token is yielded, not after a resumption that never comes (issue #38: no book
    was written after five drafted decodes of a bf16 pair). A stop string closes the steps early:
    what was measured is kept then too."""
    from specfill.api import load as api_load
    from specfill.api import stream_generate

    model, tokenizer = api_load(str(tiny_checkpoint("llama", "gguf")), backend="cuda", dtype=dtype, device="cpu")
    draft = api_load(str(tiny_checkpoint("llama", "gguf")), backend="cuda", dtype=dtype, device="cpu")[0]
    ids = prompt(30, model.args.vocab_size, seed=24)
    last = list(stream_generate(model, tokenizer, ids, 10, draft_model=draft, num_draft_tokens=3))[-1]
    assert last.drafted_tokens > 0 and last.finish_reason == "length"
    books = list(calibration_cache.glob("cuda-drafting-*.json"))
    assert len(books) == 1
    kept = json.loads(books[0].read_text())
    assert kept["key"]["dtype"] == dtype and kept["costs"]["draft_step"] > 0
    books[0].unlink()
    steps = stream_generate(model, tokenizer, ids, 10, draft_model=draft, num_draft_tokens=3)
    for response in steps:  # a consumer that stops early (a stop string, a cancelled request)
        if response.drafted_tokens:
            break
    steps.close()
    assert len(list(calibration_cache.glob("cuda-drafting-*.json"))) == 1


def test_replies_that_end_early_do_not_earn_back_the_draft_prefill(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    # drafting pays per token (draft step a tenth, flat verify, all accepted) but its prefill costs 2 plain steps
    costs = measured(0.1, 0.01, 0.11)
    book.remember(costs, prefill_seconds=0.2, prompt_tokens=500, drafted=4, accepted=4, reply=(64, False))
    assert book.expected_tokens(64) == 64 and book.skip_reason(500, 64) == ""
    for _ in range(8):  # replies a stop ended after 3 tokens: the prefill is never earned back
        book.remember(costs, prefill_seconds=0.2, prompt_tokens=500, drafted=4, accepted=4, reply=(3, True))
    assert book.expected_tokens(64) == 3 and book.expected_tokens(2) == 2
    assert "for the 3 tokens expected" in book.skip_reason(500, 64)
    book.note_reply(64, False)  # a long reply (a skipped decode's) brings the mean up: 3 * 7/8 + 64/8
    assert book.expected_tokens(64) == pytest.approx((7 * 3 + 64) / 8) and book.skip_reason(500, 64) == ""
    assert len(book.read()["replies"]) == 8


def test_kept_costs_that_say_drafting_cannot_pay_stop_it_from_the_first_round(tmp_path, monkeypatch):
    book = tiny_book(tmp_path, monkeypatch)
    book.remember(measured(0.5, 0.45, 2.5), prefill_seconds=1.0, prompt_tokens=500, drafted=4, accepted=4)
    expensive = DraftLength(4)
    book.seed(expensive)
    assert expensive.next(60) == 0  # no plain measuring round, no forced max_k round: the rule decides
    book.remember(measured(0.5, 0.02, 0.55), prefill_seconds=1.0, prompt_tokens=500, drafted=4, accepted=4)
    cheap = DraftLength(4)
    book.seed(cheap)
    assert cheap.next(60) == 4
    fresh = DraftLength(4)  # nothing kept: a plain round measures the plain step, then max_k
    assert fresh.next(60) == 0
    fresh.record(0, 0, 0.0, 0.5)
    assert fresh.next(60) == 4


def test_a_skipped_decode_notes_its_reply_and_the_speculator_has_no_book(tiny_checkpoint):
    from specfill.backends.torch_cuda import load
    from specfill.core.methods.drafting import draft_source

    main = load(tiny_checkpoint("llama", "gguf"), dtype="float32", device="cpu")[0]
    draft = load(tiny_checkpoint("qwen3", "safetensors"), dtype="float32", device="cpu")[0]
    assert draft_source(main, Drafting(None, 3), 100, SamplingConfig()).costs_book() is None  # prefills nothing
    ids = prompt(40, main.args.vocab_size, seed=7)
    book = book_for(main, draft)
    for _ in range(8):  # cheap steps, but every reply so far ended after 2 tokens
        book.remember(
            measured(0.1, 0.01, 0.11), prefill_seconds=0.4, prompt_tokens=40, drafted=4, accepted=4, reply=(2, True)
        )
    info = GenerationInfo()
    steps = main.generate_step(
        ids,
        max_tokens=9,
        sampling=SamplingConfig(),
        stop_ids=frozenset(),
        method=PrefillMethod(),
        info=info,
        drafting=Drafting(draft, 4),
    )
    for n, _ in enumerate(steps, start=1):
        if n == 9:
            break  # a reader that stops at the last token, as the API does
    assert info.decode.skipped.startswith("drafting skipped") and info.decode.drafted_tokens == 0
    assert book.read()["replies"][-1] == (9, False)
