"""specfill.open -> Session: the one request path (backend and device rules, loading, the speculator
loaded once, generation) gives the tokens the assembled path (load, build_request, Session.prepare,
stream_request) gives, on a tiny random model."""

from __future__ import annotations

import pytest

import specfill
from specfill import api
from specfill.core import ConfigError
from specfill.core.request import build_request

pytest.importorskip("torch")

PROMPT = "one two three four five six seven eight nine ten"


def assembled(path, prompt, **settings):
    """The path `specfill generate` assembled before the Session: load, build, load its models, stream."""
    model, tokenizer = api.load(path, backend="cuda", device="cpu")
    request = api.Session(model, tokenizer, device="cpu").prepare(build_request(**settings))
    return [(r.token, r.method, r.kept_tokens) for r in api.stream_request(model, tokenizer, prompt, request)]


def streamed(responses):
    return [(r.token, r.method, r.kept_tokens) for r in responses]


@pytest.mark.parametrize(
    "settings",
    [
        {"max_tokens": 6},
        {"max_tokens": 6, "method": "h2o"},
        {"max_tokens": 6, "method": "specprefill", "speculator": "self:1"},
        {"max_tokens": 6, "method": "specprefill", "speculator": "self:1", "num_draft_tokens": 2},
    ],
    ids=["full", "h2o", "specprefill", "specprefill-drafting"],
)
def test_open_then_stream_gives_the_assembled_paths_tokens(tiny_checkpoint, settings):
    path = str(tiny_checkpoint("llama", "gguf"))
    expected = assembled(path, PROMPT, **settings)
    session = specfill.open(path, backend="cuda", device="cpu")
    assert streamed(session.stream(PROMPT, **settings)) == expected
    assert streamed(session.stream(PROMPT, build_request(**settings))) == expected  # a request built already
    model, tokenizer = session.model, session.tokenizer
    assert streamed(specfill.stream_generate(model, tokenizer, PROMPT, **settings)) == expected
    text = "".join(r.text for r in session.stream(PROMPT, **settings))
    assert session.generate(PROMPT, **settings) == specfill.generate(model, tokenizer, PROMPT, **settings) == text


def test_the_sessions_speculator_is_loaded_once_and_is_the_default(tiny_checkpoint, monkeypatch):
    path = str(tiny_checkpoint("llama", "gguf"))
    other = str(tiny_checkpoint("llama", "gguf", seed=1))  # same vocabulary, other weights
    expected = assembled(path, PROMPT, max_tokens=5, method="specprefill", speculator=other)
    loads = []
    real_load = api.load
    monkeypatch.setattr(api, "load", lambda p, *a, **k: loads.append(p) or real_load(p, *a, **k))
    session = specfill.open(path, backend="cuda", device="cpu", speculator=other, prefill_step_size=3)
    assert loads == [path, other] and session.speculator is session.loaded[other][0]
    assert session.model.prefill_step_size == 3 and session.speculator.prefill_step_size == 3
    assert streamed(session.stream(PROMPT, max_tokens=5, method="specprefill")) == expected
    assert streamed(session.stream(PROMPT, max_tokens=5, method="specprefill", speculator=other)) == expected
    assert loads == [path, other]  # the speculator by its path again: the one loaded with the session
    assert streamed(session.stream(PROMPT, max_tokens=5))[-1][1] == "full"  # full: no speculator, no warning


def test_open_applies_the_backend_and_device_rules(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(api, "mlx_metal_available", lambda: False)  # the platform rule: cuda (the torch backend)
    notices = []
    session = specfill.open(str(tiny_checkpoint("llama", "gguf")), notify=notices.append)
    assert session.model.backend == "cuda"
    device, notice = api.choose_device("cuda", None)
    assert session.notice == notice and notices == ([] if notice is None else [notice])
    assert session.device == device and session.leads  # one process: it reports


def test_bad_uses_are_one_clear_error(tiny_checkpoint):
    path = str(tiny_checkpoint("llama", "gguf"))
    with pytest.raises(ConfigError, match="--model-file"):
        specfill.open(None, backend="cuda", model_file="x.gguf")
    with pytest.raises(ConfigError, match="--pipeline"):
        specfill.open(path, backend="cuda", device="cpu", pipeline=True)  # not started by mlx.launch
    with pytest.raises(ConfigError, match="prefill_step_size"):
        specfill.open(path, backend="cuda", device="cpu", prefill_step_size=0)
    session = specfill.open(path, backend="cuda", device="cpu")
    with pytest.raises(ConfigError, match="not both"):
        next(session.stream(PROMPT, build_request(max_tokens=2), max_tokens=3))
