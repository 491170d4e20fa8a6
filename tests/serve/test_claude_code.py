"""What Claude Code sends, on the rote tool model (issue 46 item 4): its request shape (the beta query,
the attribution line as the first system block, a system-role message inside `messages`, `thinking`,
`context_management`, `output_config`, `metadata`) accepted whole and streamed; two requests that
differ only in the attribution line share the whole prompt in the prompt cache; the model names an
agent asks for on its own (--served-model-pattern) answered, others 404. The placement of system
messages inside `messages` (in place, or folded into a user turn) is checked on two templates."""

from __future__ import annotations

import json

import pytest

from specfill.core.io.tokenizer import Tokenizer
from specfill.serve.anthropic import MessagesRequest, _messages, inline_system_in_place
from specfill.serve.chat import without_billing_header
from specfill.serve.errors import RequestError

anthropic = pytest.importorskip("anthropic")

KEY = "sk-claude-0123456789"
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; cch=1a2b3;"
OTHER_BILLING = "x-anthropic-billing-header: cc_version=2.1.198.f07; cc_entrypoint=sdk-cli; cch=9e8d7;"
SYSTEM_TEXT = "You are Claude Code, Anthropic's official CLI for Claude.\nAnswer briefly."
REMINDER = "The user's working directory is /tmp/scratch."
READ = {
    "name": "Read",
    "description": "Reads a file from the local filesystem.",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "number"}},
        "required": ["file_path"],
        "additionalProperties": False,
    },
}
GLOB = {
    "name": "Glob",
    "description": "Fast file pattern matching.",
    "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
}
BASH = {
    "name": "Bash",
    "description": "Runs a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"},
}


def claude_code_request(billing: str = BILLING, model: str = "claude-opus-4-7") -> dict:
    """The fields of a Claude Code 2.1 request (its shape, cut down to three tools)."""
    return {
        "model": model,
        "max_tokens": 32,
        "system": [
            {"type": "text", "text": billing},
            {"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Tools are available.</system-reminder>"},
                    {"type": "text", "text": "What is in README.md?", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {"role": "system", "content": [{"type": "text", "text": REMINDER}]},
        ],
        "tools": [READ, GLOB, BASH],
        "metadata": {"user_id": "user_0123_account__session_4567"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "betas": ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"],
    }


@pytest.fixture(scope="module")
def claude_server(tmp_path_factory: pytest.TempPathFactory):
    """The rote tool model served as `tools` and any `claude-*` name, behind a key."""
    from specfill.evaluation.serve_process import ServerProcess
    from tests.fixtures.tool_model import write_tool_checkpoint

    checkpoint = write_tool_checkpoint(tmp_path_factory.mktemp("claude") / "tiny-tools")
    server = ServerProcess(
        "--model",
        str(checkpoint),
        "--served-model-name",
        "tools",
        "tools-alias",
        "--served-model-pattern",
        "claude-*",
        "--max-tokens",
        "32",
        "--api-key",
        KEY,
        "--no-lazy-grammar",  # the rote call's get_weather is none of Claude Code's tools: left as it is written
        log=tmp_path_factory.mktemp("serve") / "claude.log",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def c(claude_server):
    return anthropic.Anthropic(base_url=claude_server.url, api_key=KEY, max_retries=0)


def test_claude_code_request_accepted(c):
    """beta.messages posts to /v1/messages?beta=true, as Claude Code does."""
    done = c.beta.messages.create(**claude_code_request())
    assert done.stop_reason == "tool_use" and done.model == "tools"  # the reply carries the served name
    (use,) = done.content
    assert use.type == "tool_use" and use.name == "get_weather"  # the rote model's call (not a declared tool)
    assert done.usage.input_tokens > 0
    counted = c.beta.messages.count_tokens(
        **{k: v for k, v in claude_code_request().items() if k not in ("max_tokens", "metadata")}
    )
    assert counted.input_tokens == done.usage.input_tokens + done.usage.cache_read_input_tokens


def test_claude_code_request_streamed(c):
    events = list(c.beta.messages.create(**claude_code_request(), stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2].delta.stop_reason == "tool_use"
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris"}


def test_billing_line_keeps_the_prefix(c):
    """Two requests differing only in the attribution line: the second reads the whole prompt from the
    cache (the line is not in the prompt: it counts as nothing)."""
    first = c.beta.messages.create(**claude_code_request(BILLING))
    again = c.beta.messages.create(**claude_code_request(OTHER_BILLING))
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == prompt
    assert again.usage.cache_read_input_tokens >= prompt - 1  # all of it (the last token may be prefilled again)
    without = claude_code_request()
    without["system"] = without["system"][1:]
    counted = c.beta.messages.count_tokens(**{k: v for k, v in without.items() if k not in ("max_tokens", "metadata")})
    assert counted.input_tokens == prompt


def test_served_names_and_patterns(c, claude_server):
    ask = {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    for name in ("tools", "tools-alias", "claude-3-5-haiku-20241022", "claude-haiku-4-5-20251001"):
        assert c.messages.create(model=name, **ask).type == "message"
    for name in ("gpt-4o", "Claude-3-5-haiku", "my-claude-model"):
        with pytest.raises(anthropic.NotFoundError) as missing:
            c.messages.create(model=name, **ask)
        assert missing.value.body["error"]["type"] == "not_found_error"
    listed = c.models.list()
    assert [m.id for m in listed.data] == ["tools", "tools-alias"]  # patterns are not names to list
    import openai

    oc = openai.OpenAI(base_url=claude_server.url + "/v1", api_key=KEY, max_retries=0)
    assert oc.models.retrieve("claude-opus-4-1").id == "claude-opus-4-1"
    with pytest.raises(openai.NotFoundError):
        oc.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)


# placement of system messages inside `messages`, on templates without a server

QWEN35_LIKE = (  # refuses a system message past the first, as Qwen3.5's template does
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and not loop.first %}{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tokenizer_with(template: str) -> Tokenizer:
    from tests.fixtures.tool_model import TOOL_TEMPLATE, tool_tokenizer

    return Tokenizer(
        tool_tokenizer(),
        bos_token_id=None,
        eos_token_ids=[0],
        chat_template=TOOL_TEMPLATE if template == "qwen2.5" else template,
    )


def conversation(*messages: dict, system: object = "Rules.") -> MessagesRequest:
    return MessagesRequest.model_validate({"max_tokens": 4, "system": system, "messages": list(messages)})


def test_inline_system_probe():
    assert inline_system_in_place(tokenizer_with("qwen2.5"))
    assert not inline_system_in_place(tokenizer_with(QWEN35_LIKE))
    dropping = "{%- for m in messages if m.role != 'system' or loop.first %}{{ m.content }}{%- endfor %}"
    assert not inline_system_in_place(tokenizer_with(dropping))  # renders, but without the message


def test_system_messages_in_place_or_folded():
    user = {"role": "user", "content": "Question"}
    note = {"role": "system", "content": "Note"}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "data"}]}
    leading = conversation(note, user)
    joined = [{"role": "system", "content": "Rules.\n\nNote"}, {"role": "user", "content": "Question"}]
    assert _messages(leading, True) == joined and _messages(leading, False) == joined
    trailing = conversation(user, note)
    assert _messages(trailing, True)[1:] == [{"role": "user", "content": "Question"}, note]
    assert _messages(trailing, False)[1:] == [{"role": "user", "content": "Question\n\nNote"}]
    after_call = conversation(user, call, note, result)  # between a call and its result: after the result
    assert _messages(after_call, False)[3:] == [
        {"role": "tool", "content": "data\n\nNote", "tool_call_id": "t1", "name": "Read"}
    ]
    after_answer = conversation(user, {"role": "assistant", "content": "Answer"}, note)
    assert _messages(after_answer, False)[-1] == {"role": "user", "content": "Note"}
    before_user = conversation(user, {"role": "assistant", "content": "Answer"}, note, user)
    assert _messages(before_user, False)[-1] == {"role": "user", "content": "Note\n\nQuestion"}
    # no system prompt: folded even where the template could render it in place
    assert _messages(conversation(user, note, system=None), True) == [{"role": "user", "content": "Question\n\nNote"}]
    with pytest.raises(RequestError, match="'messages\\[0\\].role' must be"):
        _messages(conversation({"role": "developer", "content": "x"}), True)


def test_billing_line_removed():
    assert without_billing_header(BILLING) == ""
    assert without_billing_header(BILLING + "\n\nYou are Claude Code.") == "You are Claude Code."
    assert without_billing_header("Keep x-anthropic-billing-header: inside a line") == (
        "Keep x-anthropic-billing-header: inside a line"
    )
    blocks = [{"type": "text", "text": BILLING}, {"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    assert _messages(conversation({"role": "user", "content": "Q"}, system=blocks), True)[0] == {
        "role": "system",
        "content": "A\n\nB",
    }
    assert _messages(conversation({"role": "user", "content": "Q"}, system=BILLING), True) == [
        {"role": "user", "content": "Q"}
    ]


def test_billing_line_on_the_chat_route(claude_server):
    """A router (LiteLLM, claude-code-router) hands Claude Code's system prompt on to chat completions."""
    import openai

    oc = openai.OpenAI(base_url=claude_server.url + "/v1", api_key=KEY, max_retries=0)

    def prompt_tokens(system: str) -> int:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
        return oc.chat.completions.create(model="tools", messages=messages, max_tokens=1).usage.prompt_tokens

    assert prompt_tokens(f"{BILLING}\n{SYSTEM_TEXT}") == prompt_tokens(f"{OTHER_BILLING}\n\n{SYSTEM_TEXT}")
    assert prompt_tokens(f"{BILLING}\n{SYSTEM_TEXT}") == prompt_tokens(SYSTEM_TEXT)
