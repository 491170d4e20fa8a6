"""RULER's tasks: samples are deterministic, fit the asked length, hold their answers where the
spans say, and RULER's scoring gives what it should on hand-made answers."""

import pytest

from specfill.core import ConfigError
from specfill.evaluation.ruler_data import ruler_available
from specfill.evaluation.ruler_tasks import DEFAULT_RULER_TASKS, RULER_TASKS, build_sample, expand_tasks, score

MISSING = ruler_available()
needs_data = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from specfill.core.io.tokenizer import load_tokenizer

    return load_tokenizer(tiny_checkpoint("llama", "gguf"))


def test_score_share_found_and_any_found():
    assert score("The numbers are 123 and 456.", ["123", "456", "789", "000"], "all") == 0.5
    assert score("ABCDE, fghij", ["abcde", "FGHIJ"], "all") == 1.0  # case-insensitive, as RULER
    assert score("nothing", ["x1"], "all") == 0.0
    assert score("It was Paris, France", ["London", "Paris"], "part") == 1.0
    assert score("It was Rome", ["London", "Paris"], "part") == 0.0


@needs_data
def test_score_agrees_with_rulers_metrics():
    from long_context_eval.eval.synthetic.constants import string_match_all, string_match_part

    cases = [("a 12 b 34", ["12", "34", "56"]), ("Paris", ["paris", "lyon"]), ("", ["x"])]
    for pred, refs in cases:
        assert round(100 * score(pred, refs, "all"), 2) == string_match_all([pred], [refs])
        assert round(100 * score(pred, refs, "part"), 2) == string_match_part([pred], [refs])


def test_expand_tasks():
    assert expand_tasks(["ruler", "vt", "niah_single_1"]) == [*DEFAULT_RULER_TASKS, "niah_single_1"]


@needs_data
@pytest.mark.parametrize("task", sorted(RULER_TASKS))
def test_samples_are_deterministic_and_fit_the_length(tokenizer, task):
    from specfill.api import encode_prompt

    n = {"cwe": 3000, "qa_1": 2500, "qa_2": 9000, "vt": 1500}.get(task, 600)
    a, b = build_sample(tokenizer, task, n, 3, seed=7), build_sample(tokenizer, task, n, 3, seed=7)
    assert a == b and a != build_sample(tokenizer, task, n, 4, seed=7)
    assert a.tokens == len(encode_prompt(tokenizer, a.prompt)) <= n
    assert a.tokens >= 0.8 * n  # the haystack grew to the length (QA: whole documents)
    assert a.outputs and all(a.outputs)


@needs_data
@pytest.mark.parametrize("task", ["niah_multivalue", "niah_multiquery", "niah_multikey_1", "vt"])
def test_answers_lie_in_the_marked_spans(tokenizer, task):
    """Each expected string is in the prompt, inside a needle span; the question span ends the prompt."""
    from specfill.api import encode_prompt

    s = build_sample(tokenizer, task, 1500, 0)
    ids = encode_prompt(tokenizer, s.prompt)
    marked = "".join(tokenizer.decode(ids[a:b]) for a, b in s.spans["needle"])
    assert all(out in marked for out in s.outputs), (s.outputs, marked)
    assert len(s.spans["needle"]) == (4 if task in ("niah_multivalue", "niah_multiquery") else 5 if task == "vt" else 1)
    assert s.spans["question"][0][1] == s.tokens and s.spans["question"][0][0] > s.spans["needle"][-1][1]


@needs_data
def test_variable_tracking_chain_and_common_words_counts(tokenizer):
    vt = build_sample(tokenizer, "vt", 1500, 1)
    first, *hops = vt.outputs
    assert f"VAR {first} = " in vt.prompt and all(f"VAR {b} = VAR {a}" in vt.prompt for a, b in zip(vt.outputs, hops))
    cwe = build_sample(tokenizer, "cwe", 3000, 1)
    listing = cwe.prompt.rsplit("Question:", 1)[0].rsplit("most often.", 1)[1]
    counts = {w: listing.count(f". {w} ") + listing.count(f". {w}\n") for w in cwe.outputs}
    assert len(cwe.outputs) == 10 and set(counts.values()) == {6}  # below 4096 tokens: 6 repeats each


@needs_data
def test_too_short_a_length_is_a_clear_error(tokenizer):
    with pytest.raises(ConfigError, match="too short for RULER task qa_2"):
        build_sample(tokenizer, "qa_2", 200, 0)
    with pytest.raises(ConfigError, match="unknown RULER task"):
        build_sample(tokenizer, "niah_everything", 200, 0)


@needs_data
def test_generation_stops_once_the_score_is_final(tokenizer):
    """run_sample stops at the token that completes the answer (the score the whole budget would
    give), and --answer-tokens caps RULER's budget."""
    from types import SimpleNamespace

    from specfill.core.runtime import GenerationInfo, PrefillMethod
    from specfill.evaluation import ruler_run

    sample = build_sample(tokenizer, "niah_multivalue", 600, 0)
    pieces = [" one", f" {sample.outputs[0]}", " and", *[f" {v}" for v in sample.outputs[1:]], " extra", " more"]
    pulled, budgets = [], []

    def fake_stream(prompt, max_tokens, **kwargs):
        assert prompt == sample.prompt
        budgets.append(max_tokens)
        for text in pieces[:max_tokens]:
            pulled.append(text)
            yield SimpleNamespace(text=text, ttft=0.25)

    session = SimpleNamespace(stream=fake_stream)  # a Session's stream, as run_sample calls it
    text, value, ttft = ruler_run.run_sample(session, sample, PrefillMethod(), 5, GenerationInfo())
    assert (value, ttft, len(pulled), budgets) == (0.75, 0.25, 5, [5])  # the 4th value lies past the cap
    pulled.clear()
    text, value, _ = ruler_run.run_sample(session, sample, PrefillMethod(), None, GenerationInfo())
    assert value == 1.0 and budgets[-1] == 128 and len(pulled) == 6 and text.endswith(sample.outputs[-1])
