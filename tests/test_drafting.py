"""Speculative decoding (core/methods/drafting.py) on both backends: greedy output identical to
plain greedy decoding for every kind of draft, the sampling acceptance rule exact on a tiny
vocabulary, stop ids and max_tokens inside an accepted run, and bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.config import SpecPrefillConfig
from specfill.core.driver import CausalLM
from specfill.core.errors import ConfigError, PromptTooLongError, TokenizerMismatchError
from specfill.core.methods.draft_length import DraftLength
from specfill.core.methods.drafting import (
    DraftState,
    accept,
    acceptance_probability,
    residual_distribution,
    speculative_decode,
)
from specfill.core.methods.prefill import prefill
from specfill.core.request import build_request
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig
from specfill.core.sampling import probabilities as distribution  # the rule drafting's acceptance reads
from tests.fixtures.reference_runs import prompt

BACKENDS = ["cuda", "mlx"]
SPEC = PrefillMethod(
    "specprefill", specprefill=SpecPrefillConfig(keep_ratio=0.3, lookahead=2, select_chunk=8), speculator="self:1"
)


def load(backend: str, path):
    module = pytest.importorskip("specfill.backends.torch_cuda" if backend == "cuda" else "specfill.backends.mlx")
    options = {"device": "cpu"} if backend == "cuda" else {}
    return module.load(path, dtype="float32", **options)[0]


def run(
    model,
    ids,
    max_tokens,
    method=PrefillMethod(),
    drafting=None,
    stop_ids=frozenset(),
    sampling=SamplingConfig(),
    info=None,
):
    return list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            method=method,
            info=info if info is not None else GenerationInfo(),
            drafting=drafting,
        )
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_drafting_equals_plain_greedy(tiny_checkpoint, backend):
    main = load(backend, tiny_checkpoint("llama", "gguf"))
    other = load(backend, tiny_checkpoint("qwen3", "safetensors"))  # same vocabulary, other weights
    ids = prompt(70, main.args.vocab_size, seed=21)
    plain, sparse = run(main, ids, 20), run(main, ids, 20, SPEC)
    for k in (1, 2, 4):
        info = GenerationInfo()
        assert run(main, ids, 20, drafting=Drafting("self:1", k), info=info) == plain
        assert len(info.decode.from_draft) == 20 and info.decode.drafted_tokens > 0
        assert run(main, ids, 20, drafting=Drafting(other, k)) == plain
        assert run(main, ids, 20, drafting=Drafting(main, k)) == plain  # the model drafting for itself
        assert run(main, ids, 20, SPEC, drafting=Drafting(None, k)) == sparse  # the speculator drafts
        assert run(main, ids, 20, SPEC, drafting=Drafting(other, k)) == sparse
        assert run(main, ids, 20, SPEC, drafting=Drafting("self:1", k)) == sparse  # the main cache holds kept tokens
        assert run(main, ids, 20, drafting=Drafting(other, k, adaptive=False)) == plain  # the fixed schedule
    info = GenerationInfo()
    run(main, ids, 20, drafting=Drafting(main, 3), info=info)
    record = info.decode
    assert record.accepted_tokens == record.drafted_tokens and sum(record.from_draft) == record.accepted_tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_ids_and_max_tokens_inside_an_accepted_run(tiny_checkpoint, backend):
    main = load(backend, tiny_checkpoint("llama", "gguf"))
    ids = prompt(40, main.args.vocab_size, seed=22)
    plain = run(main, ids, 16)
    stop = next(t for i, t in enumerate(plain) if i >= 3 and t not in plain[:i])
    want = run(main, ids, 16, stop_ids=frozenset({stop}))
    assert want[-1] == stop and len(want) < 16
    for max_tokens in (1, 2, 5, 16):
        assert run(main, ids, max_tokens, drafting=Drafting(main, 4)) == plain[:max_tokens]
    assert run(main, ids, 16, drafting=Drafting(main, 4), stop_ids=frozenset({stop})) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_sampling_with_a_draft_repeats(tiny_checkpoint, backend):
    main = load(backend, tiny_checkpoint("llama", "gguf"))
    ids = prompt(30, main.args.vocab_size, seed=23)
    hot = SamplingConfig(temperature=1.2, top_p=0.9, seed=5)
    first = run(main, ids, 12, drafting=Drafting("self:1", 3), sampling=hot)
    assert first == run(main, ids, 12, drafting=Drafting("self:1", 3), sampling=hot) and len(first) == 12


def test_stream_generate_reports_drafting(tiny_checkpoint):
    from specfill.api import format_stats, stream_generate
    from specfill.api import load as api_load

    model, tokenizer = api_load(str(tiny_checkpoint("llama", "gguf")), backend="cuda", dtype="float32", device="cpu")
    steps = list(
        stream_generate(
            model, tokenizer, prompt(30, model.args.vocab_size, seed=24), 10, draft_model=model, num_draft_tokens=3
        )
    )
    last = steps[-1]
    assert last.drafted_tokens > 0 and last.accepted_tokens == last.drafted_tokens  # the model drafts for itself
    assert sum(r.from_draft for r in steps) == last.accepted_tokens and not steps[0].from_draft
    assert last.draft_seconds > 0 and last.verify_seconds > 0
    assert "proposals accepted (100.0%); drafting" in format_stats(last)


def test_acceptance_rule_gives_exactly_the_main_distribution():
    """Over every draft token d ~ q: keep d with min(1, p/q), else draw from the residual; the
    output law is p exactly, for any q (tiny vocabulary, exact sums)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5) * 0.3)
        law = np.zeros(5)
        for d in range(5):
            keep = acceptance_probability(p, q, d)
            law[d] += q[d] * keep
            law += q[d] * (1.0 - keep) * residual_distribution(p, q)
        np.testing.assert_allclose(law, p, rtol=0, atol=1e-12)
    same = rng.dirichlet(np.ones(5))
    assert all(acceptance_probability(same, same, d) == 1.0 for d in range(5))


def test_accept_samples_the_main_distribution_through_the_real_function():
    """accept() with one draft from q, counted over many rounds, follows p (Monte Carlo, 5 sigma)."""
    sampling = SamplingConfig(temperature=1.0)
    logits_p, logits_q = np.log([0.1, 0.5, 0.3, 0.1]), np.log([0.4, 0.1, 0.1, 0.4])
    p, q = distribution(logits_p, sampling), distribution(logits_q, sampling)
    rng, counts, n = np.random.default_rng(1), np.zeros(4), 20000
    for _ in range(n):
        draft = int(rng.choice(4, p=q))
        accepted, following = accept([draft], [q], np.stack([logits_p, logits_p]), sampling, rng)
        counts[draft if accepted else following] += 1
    assert np.all(np.abs(counts / n - p) <= 5 * np.sqrt(p * (1 - p) / n))


def test_distribution_applies_temperature_and_top_p():
    probs = distribution(np.log([0.05, 0.5, 0.3, 0.15]), SamplingConfig(temperature=1.0, top_p=0.7))
    np.testing.assert_allclose(probs, [0, 0.625, 0.375, 0], atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_drafts_are_clear_errors(tiny_checkpoint, backend):
    main = load(backend, tiny_checkpoint("llama", "gguf"))
    with pytest.raises(ConfigError, match="num_draft_tokens must be an integer >= 1"):
        Drafting("self:1", 0)
    with pytest.raises(ConfigError, match="drafts with the SpecPrefill speculator"):  # where the request is made
        build_request(num_draft_tokens=2)
    with pytest.raises(ConfigError, match="drafts only after speculative prefill"):  # the driver's parts, unbuilt
        run(main, [5, 6, 7], 4, drafting=Drafting(None, 2))
    with pytest.raises(ConfigError, match="1 <= K <= 2"):
        run(main, [5, 6, 7], 4, drafting=Drafting("self:5", 2))
    with pytest.raises(ConfigError, match="draft model must be a model loaded"):
        run(main, [5, 6, 7], 4, drafting=Drafting(object(), 2))
    small = CausalLM(main.model, main.ops)  # the checks read only the draft's ModelArgs
    small.args = replace(main.args, max_position_embeddings=16)
    with pytest.raises(PromptTooLongError, match="draft model's context of 16"):
        run(main, prompt(20, main.args.vocab_size), 4, drafting=Drafting(small, 2))
    small.args = replace(main.args, vocab_size=300)
    with pytest.raises(TokenizerMismatchError, match="300 tokens"):
        run(main, [5, 6, 7], 4, drafting=Drafting(small, 2))


class ScriptedDraft(DraftState):
    """Proposes the plain greedy continuation `script` up to token index `good_until`, then wrong
    tokens: a draft whose acceptance falls (or rises, with `good_from`) on cue."""

    def __init__(self, script: list[int], prompt_tokens: int, vocab: int, good_until: int, good_from: int = 0):
        super().__init__(None, None, prompt_tokens, [script[0]])
        self.script, self.prompt_tokens, self.vocab = script, prompt_tokens, vocab
        self.good_until, self.good_from = good_until, good_from

    def propose(self, ops, n, sampling, rng):
        start = self.position - self.prompt_tokens + 1  # index in the output of the first draft
        right = [self.script[i] for i in range(start, start + n)]
        return [
            t if self.good_from <= i + start < self.good_until else (t + 1) % self.vocab for i, t in enumerate(right)
        ], [None] * n

    def keep(self, ops, stream, n_drafts, accepted):
        self.position += len(stream) - 1
        self.pending = stream[-1:]


def scripted(main, ids, plain, good_until, good_from=0):
    """Greedy speculative decoding of len(plain) tokens with a ScriptedDraft; (tokens, k per round)."""
    ops = main.ops
    length = DraftLength(4, timed=False)  # acceptance alone: the trajectory does not depend on the clock
    with ops.device_scope():
        cache = ops.new_cache(main.model, len(ids) + len(plain) + 8)
        logits = prefill(ops, main.model, ops.tokens(np.array(ids)), 0, cache, step_size=64)[-1]
        first = int(np.argmax(ops.to_numpy(logits)))
        draft = ScriptedDraft(plain + [0] * 8, len(ids), main.args.vocab_size, good_until, good_from)
        rest = [
            t
            for t, _ in speculative_decode(
                ops,
                main.model,
                cache,
                first,
                next_position=len(ids),
                draft=draft,
                length=length,
                max_tokens=len(plain),
                sampling=SamplingConfig(),
                stop_ids=frozenset(),
                rng=np.random.default_rng(0),
            )
        ]
    return [first] + rest, length.trajectory


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_length_follows_a_scripted_draft_and_the_tokens_stay_plain_greedy(tiny_checkpoint, backend):
    main = load(backend, tiny_checkpoint("llama", "gguf"))
    ids = prompt(30, main.args.vocab_size, seed=25)
    plain = run(main, ids, 60)
    tokens, falling = scripted(main, ids, plain, good_until=20)
    assert tokens == plain
    assert falling[:4] == [0, 4, 4, 4]  # a plain step, then right drafts at the maximum
    assert max(falling[-20:]) <= 1 and falling[-20:].count(1) <= 3  # wrong drafts: plain, rare single tries
    tokens, rising = scripted(main, ids, plain, good_until=len(plain), good_from=25)
    assert tokens == plain
    assert rising[:2] == [0, 4] and 0 in rising[2:6] and 4 in rising[-5:]  # stops, is tried again, grows
