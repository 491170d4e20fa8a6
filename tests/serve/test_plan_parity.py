"""The server's request plan and the API agree: a completion string gets the API's BOS rule, and
`auto` keeps the server's speculator (issue #23 item 1, #25 item 1). No server process needed."""
from __future__ import annotations

from specfill.api import encode_prompt, prefill_method
from specfill.serve.plan import ServerDefaults, completion_prompt_ids, request_method
from specfill.serve.protocol import CompletionRequest


class BosTokenizer:
    """One id per word; BOS is id 1 written "<s>", added when add_special_tokens is true."""

    bos_token_id = 1

    def token_text(self, token: int) -> str:
        return "<s>" if token == 1 else str(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [1 if w == "<s>" else 2 + len(w) for w in text.replace("<s>", "<s> ").split()]
        return ([1] if add_special_tokens else []) + ids


def test_completion_string_gets_the_api_bos_rule():
    tok = BosTokenizer()
    for prompt in ("3 4 5", "<s>3 4 5"):
        ids = completion_prompt_ids(tok, CompletionRequest(model="m", prompt=prompt), vocab_size=64)
        assert ids == encode_prompt(tok, prompt)
        assert ids.count(1) == 1  # BOS once, never [bos, bos, ...]


def test_auto_keeps_the_server_speculator():
    defaults = ServerDefaults(model_id="m", speculator="self:1")
    request = CompletionRequest(model="m", prompt="3 4 5", method="auto")
    method = request_method("auto", request, defaults, prompt_tokens=3, notes=[])
    api = prefill_method("auto", speculator="self:1")
    assert method.speculator == api.speculator == "self:1"


def test_reply_names_the_method_that_ran():
    """An "auto" request's stats carry the resolved method (PrefillInfo.method), not "auto"."""
    from types import SimpleNamespace

    from specfill.core.runtime import PrefillInfo
    from specfill.serve.engine import Engine

    plan = SimpleNamespace(method_name="auto", queue_seconds=0.0, notes=[])
    last = SimpleNamespace(prompt_tokens=3, kept_tokens=1, ttft=0.1, prompt_tps=30.0, generation_tokens=2,
                           generation_tps=20.0, peak_memory=0.0, drafted_tokens=0, accepted_tokens=0)
    info = PrefillInfo()
    info.method = "specprefill"
    stats = Engine.stats(plan, "off", prefill_method("auto", speculator="self:1"), SimpleNamespace(cached=0),
                         last, info)
    assert stats["method"] == "auto" and stats["prefill_method"] == "specprefill"
