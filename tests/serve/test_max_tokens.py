"""A request's max_tokens against the model's context: an agent's fixed output budget beside a long
conversation is clipped to the room the context leaves (llama.cpp's server, Ollama and LM Studio do the
same); a max_tokens past the whole context, or a prompt that fills it, is a 400 naming the field."""

from __future__ import annotations

import pytest

from specfill.serve.errors import RequestError
from specfill.serve.plan import ServerDefaults, build_plan
from specfill.serve.protocol import ChatRequest
from tests.serve.harness import post

CHAT, COMPLETE = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "1 2 3"}]


def plan(max_tokens: int | None, prompt_tokens: int, context: int = 4096):
    body = {"messages": MSG} if max_tokens is None else {"messages": MSG, "max_tokens": max_tokens}
    return build_plan("chat", ChatRequest(**body), [5] * prompt_tokens, ServerDefaults("tiny", max_tokens=512), context)


def test_an_agents_budget_is_clipped_to_the_room_left():
    clipped = plan(4000, 3000)  # Claude Code's 32000 beside a conversation, scaled down
    assert clipped.request.max_tokens == 1096
    assert clipped.notes == [
        "max_tokens 4000 clipped to 1096: the prompt's 3000 tokens leave 1096 of the model's context of 4096"
    ]
    assert plan(4096, 4095).request.max_tokens == 1  # the whole context asked: what is left
    fits = plan(1000, 3000)
    assert fits.request.max_tokens == 1000 and fits.notes == []
    assert plan(None, 4000).request.max_tokens == 96 and plan(None, 10).request.max_tokens == 512  # the default


@pytest.mark.parametrize(
    ("max_tokens", "prompt_tokens", "words"),
    [
        (5000, 10, "prompt of 10 tokens plus max_tokens 5000 exceeds the model's context of 4096 tokens"),
        (10**30, 10, "exceeds the model's context of 4096 tokens"),
        (100, 4096, "prompt of 4096 tokens plus max_tokens 100 exceeds"),  # the prompt fills the context alone
        (None, 5000, "prompt of 5000 tokens plus max_tokens 1 exceeds"),
    ],
)
def test_what_no_prompt_fits_is_a_400(max_tokens, prompt_tokens, words):
    with pytest.raises(RequestError, match=words) as caught:
        plan(max_tokens, prompt_tokens)
    assert caught.value.param == "messages" and caught.value.status == 400


def test_served_clipped_reply_ends_at_the_context(tiny_server):
    prompt = [4 + i % 500 for i in range(4080)]  # 4,080 ids of the tiny model's 4,096-token context
    status, reply = post(tiny_server.url + COMPLETE, {"prompt": prompt, "max_tokens": 4000, "temperature": 0})
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] <= 16 and reply["choices"][0]["finish_reason"] in ("length", "stop")
    assert reply["specfill"]["notes"] == [
        "max_tokens 4000 clipped to 16: the prompt's 4080 tokens leave 16 of the model's context of 4096"
    ]
    status, reply = post(tiny_server.url + CHAT, {"messages": MSG, "max_tokens": 4097})
    assert status == 400 and "max_tokens 4097 exceeds the model's context of 4096" in reply["error"]["message"]
