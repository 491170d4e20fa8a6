"""One request, one path (issue #23 item 1): the server and the API build the same request
(core/request.build_request) from the same input, so they run the same token ids with the same
method and give the same greedy text, for chat, completion and auto; a setting's range error
is the same check, answered by the server as a 400 naming its field."""

from __future__ import annotations

import openai
import pytest

from specfill.api import encode_prompt, generate, load
from specfill.core.runtime import GenerationInfo
from specfill.evaluation.serve_process import client

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The capital of France is"
CASES = [  # (kind, method fields sent to both, the method the reply must name)
    ("chat", {"method": "full"}, "full"),
    ("completion", {"method": "h2o"}, "h2o"),
    ("completion", {"method": "specprefill", "keep_ratio": 0.5}, "specprefill"),
    ("chat", {"method": "auto", "auto_threshold": 1}, "specprefill"),  # auto keeps the server's speculator
]


@pytest.fixture(scope="module")
def demo():
    return load(None, backend="cuda", device="cpu", dtype="float32")  # as the demo server runs


def _api(demo, kind: str, fields: dict) -> tuple[str, int, GenerationInfo]:
    """The same settings through specfill.generate (the server's speculator: self:8)."""
    model, tokenizer = demo
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True) if kind == "chat" else PROMPT
    settings = dict(fields)
    if "keep_ratio" in settings:
        from specfill.core import SpecPrefillConfig

        settings["specprefill"] = SpecPrefillConfig(keep_ratio=settings.pop("keep_ratio"))
    if settings["method"] in ("specprefill", "auto"):
        settings["speculator"] = "self:8"
    info = GenerationInfo()
    text = generate(model, tokenizer, prompt, 8, prefill_info=info, **settings)
    return text, len(encode_prompt(tokenizer, prompt)), info


@pytest.mark.parametrize("kind,fields,ran", CASES, ids=[f"{k}-{f['method']}" for k, f, _ in CASES])
def test_server_and_api_run_the_same_request(demo_server, demo, kind, fields, ran):
    c = client(demo_server)
    body = {**fields, "prompt_cache": "off"}  # a cached prefix would run full prefill over the new tokens only
    if kind == "chat":
        r = c.chat.completions.create(model=demo_server.model, messages=MESSAGES, max_tokens=8, extra_body=body)
        text = r.choices[0].message.content
    else:
        r = c.completions.create(model=demo_server.model, prompt=PROMPT, max_tokens=8, extra_body=body)
        text = r.choices[0].text
    stats = r.model_extra["specfill"]
    api_text, api_prompt_tokens, info = _api(demo, kind, fields)
    assert r.usage.prompt_tokens == api_prompt_tokens  # the same token ids in (BOS rule, chat template)
    assert stats["prefill_method"] == info.method == ran
    assert stats["kept_tokens"] == info.kept_tokens
    assert text == api_text


def test_a_range_error_is_the_same_check_on_both(demo_server, demo):
    with pytest.raises(Exception, match="keep ratio must be in"):
        _api(demo, "completion", {"method": "specprefill", "keep_ratio": 1.5})
    with pytest.raises(openai.BadRequestError) as err:
        client(demo_server).completions.create(
            model=demo_server.model,
            prompt=PROMPT,
            max_tokens=4,
            extra_body={"method": "specprefill", "keep_ratio": 1.5},
        )
    assert "keep ratio must be in" in str(err.value) and err.value.body["param"] == "keep_ratio"
    with pytest.raises(openai.BadRequestError) as err:
        client(demo_server).completions.create(
            model=demo_server.model, prompt=PROMPT, max_tokens=4, extra_body={"method": "full", "auto_threshold": 5}
        )
    assert err.value.body["param"] == "auto_threshold"
