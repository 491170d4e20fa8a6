"""Protected spans (serve/segments.py, issue 46 item 2): a chat request's `protect` segments as prompt
token spans from the chat template's own boundaries (the Qwen2.5-style tool template of the rote
tool model), and the plan's SpecPrefill config carrying them (other methods: untouched)."""

from __future__ import annotations

import pytest

from specfill import load
from specfill.serve.chat import chat_prompt, chat_setup
from specfill.serve.plan import ServerDefaults, build_plan
from specfill.serve.protocol import ChatRequest
from specfill.serve.segments import protected_spans
from tests.fixtures.tool_model import write_tool_checkpoint

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
MESSAGES = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Read the file please."},
    {"role": "assistant", "content": "Reading it now."},
    {"role": "user", "content": "Here is the file: alpha beta gamma. What does it say?"},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pytest.importorskip("torch")
    return load(write_tool_checkpoint(tmp_path_factory.mktemp("tools") / "tiny-tools"), backend="cuda", device="cpu")[1]


def prompt(tokenizer, **fields):
    request = ChatRequest(messages=MESSAGES, tools=[TOOL], **fields)
    setup = chat_setup(request, tokenizer.chat_template)
    return request, setup, chat_prompt(tokenizer, request, setup)[0]


def text(tokenizer, ids, span):
    return tokenizer.decode(ids[span[0] : span[1]])


def test_each_segment_is_the_span_the_template_renders_it_in(tokenizer):
    request, setup, ids = prompt(tokenizer, protect=["system"])
    ((start, end),) = protected_spans(tokenizer, request, setup, ids)
    system = text(tokenizer, ids, (start, end))
    assert start == 0 and "careful coding agent" in system and "get_weather" in system  # tools in its turn
    assert "Read the file" not in system
    request, setup, ids = prompt(tokenizer, protect=["tools"])
    ((a, b),) = protected_spans(tokenizer, request, setup, ids)
    assert (
        "get_weather" in text(tokenizer, ids, (a, b))
        and b <= end
        and "Read the file" not in text(tokenizer, ids, (a, b))
    )
    request, setup, ids = prompt(tokenizer, protect=["last_user"])
    ((a, b),) = protected_spans(tokenizer, request, setup, ids)
    last = text(tokenizer, ids, (a, b))
    assert "alpha beta gamma" in last and "Read the file" not in last and "Reading it now" not in last
    assert b < len(ids)  # the generation prompt after it is not the user's
    request, setup, ids = prompt(tokenizer, protect=["system", "last_user"])
    assert len(protected_spans(tokenizer, request, setup, ids)) == 2
    request, setup, ids = prompt(tokenizer, protect=[])
    assert protected_spans(tokenizer, request, setup, ids) == ()


def test_a_request_with_tools_protects_every_segment_unless_told_otherwise(tokenizer):
    """No `protect` field: an agent's request (tools declared) protects system, tools and last_user;
    a request without tools protects none (its document is usually the latest user message)."""
    request, setup, ids = prompt(tokenizer)
    every = protected_spans(tokenizer, request, setup, ids)
    request, setup, ids = prompt(tokenizer, protect=["system", "tools", "last_user"])
    assert every == protected_spans(tokenizer, request, setup, ids) and len(every) == 3
    bare = ChatRequest(messages=MESSAGES)
    setup = chat_setup(bare, tokenizer.chat_template)
    assert protected_spans(tokenizer, bare, setup, chat_prompt(tokenizer, bare, setup)[0]) == ()


def test_the_plan_gives_specprefill_its_spans_and_no_other_method(tokenizer):
    defaults = ServerDefaults("tiny", speculator="self:1")
    request, setup, ids = prompt(tokenizer, protect=["last_user"], method="specprefill")
    spans = protected_spans(tokenizer, request, setup, ids)
    plan = build_plan("chat", request, ids, defaults, 4096, spans)
    assert plan.request.method.specprefill.protected == spans
    request, setup, ids = prompt(tokenizer, protect=["last_user"], method="full")
    assert build_plan("chat", request, ids, defaults, 4096, spans).request.method.specprefill is None
    request, setup, ids = prompt(tokenizer, protect=["last_user"], method="auto")  # auto hands them on
    assert build_plan("chat", request, ids, defaults, 4096, spans).request.method.specprefill.protected == spans


def test_a_protected_latest_user_message_is_kept_whole_by_the_server(demo_server):
    from specfill.evaluation.serve_process import client

    c = client(demo_server, timeout=300)
    document = "\n".join(f"Line {i}: the archive code of shelf {i} is {i * 37 % 101}." for i in range(40))
    messages = [
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi. Send the list."},
        {"role": "user", "content": f"Here is the list.\n\n{document}\n\nWhich code does shelf 7 have?"},
    ]

    def kept(**fields):
        r = c.chat.completions.create(
            model=demo_server.model,
            messages=messages,
            max_tokens=4,
            temperature=0,
            extra_body={"method": "specprefill", "keep_ratio": 0.1, "prompt_cache": "off", **fields},
        )
        return r.model_extra["specfill"]

    plain, protected = kept(), kept(protect=["last_user"])
    assert plain["kept_tokens"] < protected["prompt_tokens"] / 4  # the list is most of the prompt
    assert 0.9 * protected["prompt_tokens"] < protected["kept_tokens"] < protected["prompt_tokens"]
    assert protected["prefill_method"] == "specprefill"
