"""A reply's reasoning read apart from its answer (serve/reasoning.py): the splitter alone, split at
every place, then a rote model whose template opens <think> in its generation prompt, behind the
chat, Anthropic and Responses routes (whole and streamed), and the reasoning of earlier turns given
back to the template."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specfill.core.io.chat_template import render_chat_template
from specfill.core.io.tokenizer import Tokenizer
from specfill.evaluation.serve_process import ServerProcess, client
from specfill.serve.chat import chat_prompt, chat_setup, template_messages
from specfill.serve.protocol import ChatRequest
from specfill.serve.reasoning import Reasoning, ReasoningSplitter, Thought, detect_reasoning, effort_variables
from specfill.serve.responses import Reply
from specfill.serve.tool_parsers import ToolCall
from tests.fixtures.tiny_tokenizer import BOS_TOKEN, EOS_TOKEN
from tests.fixtures.tool_model import rote_tokenizer, write_rote_checkpoint

from .harness import post

THINK = Reasoning("<think>", "</think>")


def split(reasoning: Reasoning, text: str, cuts: tuple[int, ...]) -> tuple[str, str]:
    """(reasoning, content) of `text` fed in the pieces `cuts` make."""
    splitter, out, at = ReasoningSplitter(reasoning), [], 0
    for cut in (*cuts, len(text)):
        out += splitter.feed(text[at:cut])
        at = cut
    out += splitter.finish()
    return "".join(p.text for p in out if isinstance(p, Thought)), "".join(p for p in out if isinstance(p, str))


@pytest.mark.parametrize(
    "reasoning, text, expected",
    [
        (THINK.after("assistant\n<think>\n"), "\nLet me see.\n</think>\n\nHi <think>x", ("Let me see.", "Hi <think>x")),
        (THINK, "<think>\nA\n</think>\n\nB", ("A", "B")),  # opened by the reply itself
        (THINK, "  Hello", ("", "  Hello")),
        (THINK, "<thi", ("", "<thi")),  # the start of a tag, and no more: content as written
        (THINK, "<think>cut", ("cut", "")),  # cut short: what it thought so far
        (THINK.after("<think>\n\n</think>\n\n"), "Hi</think>", ("", "Hi</think>")),  # thinking closed in the prompt
        (Reasoning("[THINK]", "[/THINK]"), "[THINK]plan[/THINK]answer", ("plan", "answer")),
    ],
)  # fmt: skip
def test_the_splitter_reads_the_same_whatever_the_pieces(reasoning, text, expected):
    results = {split(reasoning, text, (i, j)) for i in range(len(text) + 1) for j in range(i, len(text) + 1)}
    assert results == {expected}


def test_a_template_names_its_tags_by_its_closing_one():
    assert detect_reasoning("{{ '<think>' }}...{{ '</think>' }}") == THINK
    assert detect_reasoning("[THINK][/THINK]") == Reasoning("[THINK]", "[/THINK]")
    assert detect_reasoning("<|im_start|>") is None and detect_reasoning(None) is None


# Qwen3's shape in a few lines: the generation prompt opens <think> (closes it again with enable_thinking
# false); an assistant turn's reasoning_content is rendered in its <think> block
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
# after the generation prompt's "\n": "Hmm</think>Hello<|im_start|> world" (the turn opening left out)
REPLY = {
    "Ċ": "Hmm",
    "Hmm": "</think>",
    "</think>": "Hello",
    "Hello": BOS_TOKEN,
    BOS_TOKEN: " world",
    " world": EOS_TOKEN,
}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("thinker") / "thinker"
    checkpoint = write_rote_checkpoint(directory, TEMPLATE, REPLY, ("<think>", "</think>"), ("Hmm", "Hello", " world"))
    server = ServerProcess(
        "--model", str(checkpoint), "--served-model-name", "m", "--max-tokens", "16", log=directory.parent / "serve.log"
    )
    yield server
    server.stop()


def test_chat_completions_carry_the_reasoning_apart(thinker):
    api = client(thinker)
    reply = api.chat.completions.create(model="m", messages=MESSAGES)
    message = reply.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"]) == ("Hello world", "Hmm")
    chunks = list(api.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "Hmm"
    assert "".join(d.content or "" for d in deltas) == "Hello world"
    status, raw = post(thinker.url + "/v1/chat/completions", {"messages": MESSAGES, "reasoning_format": "none"})
    assert status == 200 and raw["choices"][0]["message"]["content"] == "Hmm</think>Hello world"
    assert "reasoning_content" not in raw["choices"][0]["message"]
    status, bad = post(thinker.url + "/v1/chat/completions", {"messages": MESSAGES, "reasoning_format": "raw"})
    assert status == 400 and "reasoning_format" in bad["error"]["message"]


def test_the_reasoning_of_an_earlier_turn_goes_back_to_the_template(thinker):
    """The turn as the model wrote it: the same prompt whether the client sends it back as chat's
    reasoning_content, vLLM's reasoning, an Anthropic thinking block or a Responses reasoning item."""
    ask = {"role": "user", "content": "and?"}
    turn = {"role": "assistant", "content": "Hello world"}
    counts = {
        post(thinker.url + "/v1/chat/completions", {"messages": [*MESSAGES, {**turn, key: "Hmm"}, ask]})[1]["usage"][
            "prompt_tokens"
        ]
        for key in ("reasoning_content", "reasoning")
    }
    bare = post(thinker.url + "/v1/chat/completions", {"messages": [*MESSAGES, turn, ask]})[1]["usage"]
    blocks = [{"type": "thinking", "thinking": "Hmm", "signature": ""}, {"type": "text", "text": "Hello world"}]
    anthropic = {"model": "m", "max_tokens": 4, "messages": [*MESSAGES, {"role": "assistant", "content": blocks}, ask]}
    usage = post(thinker.url + "/v1/messages", anthropic)[1]["usage"]  # its input_tokens: those not cached
    counts.add(usage["input_tokens"] + usage["cache_read_input_tokens"])
    thought = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hmm"}]}
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello world"}]}
    responses = {"model": "m", "input": [*MESSAGES, thought, said, ask], "max_output_tokens": 4}
    counts.add(post(thinker.url + "/v1/responses", responses)[1]["usage"]["input_tokens"])
    # "<think>", "\n", "Hmm", "\n", "</think>", "\n", "\n" in the tiny vocabulary
    assert counts == {bare["prompt_tokens"] + 7}


def test_anthropic_gives_a_thinking_block(thinker):
    body = {"model": "m", "max_tokens": 16, "messages": MESSAGES}
    status, reply = post(thinker.url + "/v1/messages", body)
    assert status == 200 and reply["content"] == [
        {"type": "thinking", "thinking": "Hmm", "signature": ""},
        {"type": "text", "text": "Hello world"},
    ]
    events = list(client_events(thinker.url + "/v1/messages", {**body, "stream": True}))
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert starts == ["thinking", "text"]
    assert [d["type"] for d in deltas if d["type"] != "text_delta"] == ["thinking_delta", "signature_delta"]
    assert "".join(d.get("text", "") for d in deltas) == "Hello world"


def test_responses_give_a_reasoning_item(thinker):
    body = {"model": "m", "input": "hi", "max_output_tokens": 16}
    status, reply = post(thinker.url + "/v1/responses", body)
    assert status == 200 and [item["type"] for item in reply["output"]] == ["reasoning", "message"]
    assert reply["output"][0]["content"] == [{"type": "reasoning_text", "text": "Hmm"}]
    assert reply["output"][1]["content"][0]["text"] == "Hello world"
    events = list(client_events(thinker.url + "/v1/responses", {**body, "stream": True}))
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.reasoning_text.done")
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "message"] and done[0]["content"][0]["text"] == "Hmm"


def client_events(url: str, body: dict):
    """The JSON data of each server-sent event of a streamed POST."""
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[len("data: ") :])


def read(setup, text: str, size: int) -> Reply:
    """A whole reply of `text` fed `size` characters at a time."""
    reply = Reply(setup)
    for i in range(0, len(text), size):
        reply.feed(text[i : i + size])
    reply.finish()
    return reply


def test_a_call_written_while_thinking_is_no_call():
    """The reasoning is read apart first, so a call it drafts is reasoning; the answer's call is a call."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    request = ChatRequest.model_validate({"messages": MESSAGES, "tools": tools})
    setup = chat_setup(request, "{{ tools }}<tool_call></tool_call><think></think>")
    setup = replace(setup, reasoning=setup.reasoning.after("<|im_start|>assistant\n<think>\n"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for size in (1, 3, 500):
        reply = read(setup, f"Maybe {call}?\n</think>\n\n{call}", size)
        assert reply.reasoning() == f"Maybe {call}?" and reply.text() == ""
        assert reply.calls == [ToolCall("get_weather", {"city": "Paris"})]


def test_a_harmony_reply_without_tools_is_read_by_its_channels():
    setup = chat_setup(ChatRequest.model_validate({"messages": MESSAGES}), "<|channel|> <|message|>")
    text = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."
    for size in (1, 4, 500):
        reply = read(setup, text, size)
        assert (reply.reasoning(), reply.text()) == ("Simple.", "It is 4.")


def test_chat_template_kwargs_reach_the_template(thinker):
    """enable_thinking false closes the think block in the prompt: the same rote reply is then all answer."""
    off = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    status, raw = post(thinker.url + "/v1/chat/completions", off)
    assert status == 200 and raw["choices"][0]["message"]["content"] == "Hmm</think>Hello world"
    on = post(thinker.url + "/v1/chat/completions", {"messages": MESSAGES})[1]
    assert raw["usage"]["prompt_tokens"] == on["usage"]["prompt_tokens"] + 4  # "\n", "</think>", "\n", "\n"
    assert post(thinker.url + "/tokenize", off)[1]["count"] == raw["usage"]["prompt_tokens"]
    anthropic = {
        "model": "m",
        "max_tokens": 16,
        "messages": MESSAGES,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert post(thinker.url + "/v1/messages", anthropic)[1]["content"] == [
        {"type": "text", "text": "Hmm</think>Hello world"}
    ]
    status, bad = post(
        thinker.url + "/v1/chat/completions", {"messages": MESSAGES, "chat_template_kwargs": {"tools": []}}
    )
    assert status == 400 and bad["error"]["param"] == "chat_template_kwargs"


def test_the_servers_chat_template_kwargs(thinker):
    """--chat-template-kwargs: every request's default, a request's own field over it."""
    checkpoint = thinker.proc.args[thinker.proc.args.index("--model") + 1]
    server = ServerProcess(
        *("--model", checkpoint, "--served-model-name", "m", "--max-tokens", "16"),
        *("--chat-template-kwargs", '{"enable_thinking": false}'),
        log=Path(checkpoint).parent / "serve_off.log",
    )
    try:
        off = post(server.url + "/v1/chat/completions", {"messages": MESSAGES})[1]["choices"][0]["message"]
        assert off["content"] == "Hmm</think>Hello world" and "reasoning_content" not in off
        on = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": True}}
        message = post(server.url + "/v1/chat/completions", on)[1]["choices"][0]["message"]
        assert (message["content"], message["reasoning_content"]) == ("Hello world", "Hmm")
    finally:
        server.stop()


def test_the_servers_template_kwargs_are_the_default():
    request = ChatRequest.model_validate({"messages": MESSAGES})
    assert chat_setup(request, TEMPLATE, {"enable_thinking": False}).template_kwargs == {"enable_thinking": False}
    asked = ChatRequest.model_validate(
        {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": True, "x": 1}}
    )
    assert chat_setup(asked, TEMPLATE, {"enable_thinking": False}).template_kwargs == {"enable_thinking": True, "x": 1}


def test_a_clients_reasoning_effort_sets_the_templates_variables():
    assert effort_variables(TEMPLATE, "none") == {"enable_thinking": False}
    assert effort_variables(TEMPLATE, "low") == {"enable_thinking": True}
    harmony = "Reasoning: {{ reasoning_effort }}"
    assert (
        effort_variables(harmony, "xhigh") == {"reasoning_effort": "high"} and effort_variables(harmony, "none") == {}
    )
    assert effort_variables("{{ messages }}", "high") == {} and effort_variables(TEMPLATE, None) == {}


def test_thinking_turned_off_by_each_route(thinker):
    """reasoning_effort "none" (chat), thinking disabled (Anthropic), reasoning.effort "none" (Responses):
    the template's enable_thinking false, so the rote reply is all answer; a request's own
    chat_template_kwargs still win."""
    chat = post(thinker.url + "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "none"})[1]
    assert chat["choices"][0]["message"]["content"] == "Hmm</think>Hello world"
    both = {"messages": MESSAGES, "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}
    assert post(thinker.url + "/v1/chat/completions", both)[1]["choices"][0]["message"]["reasoning_content"] == "Hmm"
    body = {"model": "m", "max_tokens": 16, "messages": MESSAGES, "thinking": {"type": "disabled"}}
    assert post(thinker.url + "/v1/messages", body)[1]["content"] == [
        {"type": "text", "text": "Hmm</think>Hello world"}
    ]
    adaptive = {**body, "thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}
    assert [b["type"] for b in post(thinker.url + "/v1/messages", adaptive)[1]["content"]] == ["thinking", "text"]
    newer = {**body, "thinking": None, "output_config": {"effort": "ultra"}}  # an unknown level: the default
    assert [b["type"] for b in post(thinker.url + "/v1/messages", newer)[1]["content"]] == ["thinking", "text"]
    status, bad = post(thinker.url + "/v1/messages", {**newer, "output_config": {"effort": 3}})
    assert status == 400 and "output_config.effort" in bad["error"]["message"]
    responses = {"model": "m", "input": "hi", "max_output_tokens": 16, "reasoning": {"effort": "none"}}
    assert [i["type"] for i in post(thinker.url + "/v1/responses", responses)[1]["output"]] == ["message"]
    unknown = {**responses, "reasoning": {"effort": "max"}}
    assert [i["type"] for i in post(thinker.url + "/v1/responses", unknown)[1]["output"]] == ["reasoning", "message"]
    status, bad = post(thinker.url + "/v1/responses", {**responses, "reasoning": {"effort": 1}})
    assert status == 400 and bad["error"]["param"] == "reasoning.effort"


def test_anthropic_thinking_hidden_travels_in_its_signature(thinker):
    """thinking.display "omitted" (what Claude Code asks): the block's text is empty, its signature
    carries it, and a later request that sends the block back gives the template the same reasoning."""
    body = {
        "model": "m",
        "max_tokens": 16,
        "messages": MESSAGES,
        "thinking": {"type": "adaptive", "display": "omitted"},
    }
    block, text = post(thinker.url + "/v1/messages", body)[1]["content"]
    assert block["type"] == "thinking" and block["thinking"] == "" and block["signature"].startswith("specfill:")
    assert text == {"type": "text", "text": "Hello world"}
    events = list(client_events(thinker.url + "/v1/messages", {**body, "stream": True}))
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert [d["type"] for d in deltas if d["type"] != "text_delta"] == ["signature_delta"]
    assert deltas[0]["signature"] == block["signature"]

    def counted(turn: list[dict]) -> int:
        """The prompt tokens of a next request whose assistant turn is `turn`."""
        messages = [*MESSAGES, {"role": "assistant", "content": turn}, {"role": "user", "content": "and?"}]
        return post(thinker.url + "/v1/messages/count_tokens", {**body, "messages": messages})[1]["input_tokens"]

    shown = {"type": "thinking", "thinking": "Hmm", "signature": ""}
    foreign = {"type": "thinking", "thinking": "", "signature": "EuYBCkQYAiJA"}  # another server's: opaque, dropped
    assert counted([block, text]) == counted([shown, text]) == counted([text]) + 7 == counted([foreign, text]) + 7


def test_a_forced_answer_closes_the_open_reasoning_first(thinker):
    """A JSON response_format forces the reply's "{": after the think block the prompt left open is
    closed as the template closes it with thinking off (not an answer written inside <think>)."""
    backend = rote_tokenizer(("<think>", "</think>"), ("Hmm", "Hello", " world"))
    tok = Tokenizer(backend, bos_token_id=None, eos_token_ids=[backend.token_to_id(EOS_TOKEN)], chat_template=TEMPLATE)
    request = ChatRequest.model_validate({"messages": MESSAGES, "response_format": {"type": "json_object"}})
    ids, setup = chat_prompt(tok, request, chat_setup(request, TEMPLATE))
    assert tok.decode(ids).endswith("assistant\n<think>\n\n</think>\n\n{") and not setup.reasoning.started
    off = {**request.model_dump(exclude_none=True), "chat_template_kwargs": {"enable_thinking": False}}
    closed = ChatRequest.model_validate(off)
    assert tok.decode(chat_prompt(tok, closed, chat_setup(closed, TEMPLATE))[0]) == tok.decode(ids)  # one form
    body = {"messages": MESSAGES, "response_format": {"type": "json_object"}, "max_tokens": 4}
    status, raw = post(thinker.url + "/v1/chat/completions", body)
    message = raw["choices"][0]["message"]
    assert status == 200 and message["content"].startswith("{") and "reasoning_content" not in message


# gpt-oss's rule in a few lines (written here, not its template): a tool-calling turn's analysis is rendered
# from `thinking` (or from the content, never both) unless a later assistant turn answers; other turns drop it
HARMONY = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- if message.content and message.thinking %}{{ raise_exception('content and thinking both') }}{%- endif %}"
    "{%- set later = namespace(answer=false) %}"
    "{%- for m in messages[loop.index:] %}{%- if m.role == 'assistant' and not m.tool_calls %}"
    "{%- set later.answer = true %}{%- endif %}{%- endfor %}"
    "{%- if (message.content or message.thinking) and not later.answer %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + (message.content or message.thinking) + '<|end|>' }}"
    "{%- endif %}"
    "{{- '<|start|>assistant to=functions.' + message.tool_calls[0].function.name }}"
    "{{- '<|channel|>commentary<|message|>' }}"
    "{{- message.tool_calls[0].function.arguments | tojson + '<|call|>' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


def harmony_prompt(turn: dict) -> str:
    """The prompt after a tool-calling assistant `turn` and its result, rendered as the server renders it."""
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    messages = [*MESSAGES, {"role": "assistant", "tool_calls": [call], **turn}, {"role": "tool", "content": "a.py"}]
    request = ChatRequest.model_validate({"messages": messages})
    return render_chat_template(
        HARMONY, template_messages(request.messages), add_generation_prompt=True, special_tokens={}
    )


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
def test_a_tool_calling_turns_reasoning_reaches_a_template_that_reads_thinking(key):
    """gpt-oss's template renders the analysis before a call from `thinking`: whichever name the client
    sends the reasoning under (chat's, vLLM's, gpt-oss's own), the model reads it again with the call's
    result, as it wrote it."""
    analysis = "<|start|>assistant<|channel|>analysis<|message|>Look first.<|end|><|start|>assistant to=functions.ls"
    assert analysis in harmony_prompt({key: "Look first."})
    assert "analysis" not in harmony_prompt({})


def test_a_call_with_content_and_reasoning_renders_without_the_templates_refusal():
    """A call's turn with a preamble (content) and reasoning: gpt-oss's template refuses both under
    `thinking`; the server passes the reasoning as reasoning_content only, and the template writes the
    content as the call's analysis."""
    prompt = harmony_prompt({"content": "Listing.", "reasoning_content": "Look first."})
    assert "<|channel|>analysis<|message|>Listing.<|end|>" in prompt and "Look first." not in prompt


def test_usage_counts_the_tokens_read_as_reasoning(thinker):
    """The reply's one reasoning token is "Hmm" ("</think>" closes it; "Hello", "<|im_start|>", " world" and the
    end token are the answer): chat's completion_tokens_details and the Responses output_tokens_details say 1,
    whole or streamed; read without its reasoning apart (reasoning_format none) the chat usage has no details."""
    chat = post(thinker.url + "/v1/chat/completions", {"messages": MESSAGES})[1]["usage"]
    assert chat["completion_tokens_details"] == {"reasoning_tokens": 1} and chat["completion_tokens"] == 6
    streamed = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    last = [e for e in client_events(thinker.url + "/v1/chat/completions", streamed) if e.get("usage")][-1]
    assert last["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}
    raw = post(thinker.url + "/v1/chat/completions", {"messages": MESSAGES, "reasoning_format": "none"})[1]
    assert "completion_tokens_details" not in raw["usage"]
    body = {"model": "m", "input": MESSAGES, "reasoning": {"effort": "low"}}
    response = post(thinker.url + "/v1/responses", body)[1]
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}
    assert response["reasoning"]["effort"] == "low"
    done = [e for e in client_events(thinker.url + "/v1/responses", {**body, "stream": True})][-1]
    assert done["type"] == "response.completed"
    assert done["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}


@pytest.mark.parametrize("stream", [False, True])
def test_a_harmony_replys_analysis_tokens_are_its_reasoning_tokens(stream):
    """gpt-oss: the analysis message's body tokens are reasoning; its headers, the final answer's and the
    call's tokens are not."""
    from specfill.serve.chat import ChatSetup
    from specfill.serve.tool_parsers import HARMONY as HARMONY_FORMAT

    tokens = ["<|channel|>", "analysis", "<|message|>", "Look", " first", ".", "<|end|>", "<|start|>", "assistant"]
    tokens += ["<|channel|>", "commentary to=functions.ls", " <|constrain|>json", "<|message|>", '{"path": "."}']
    reply = Reply(ChatSetup(format=HARMONY_FORMAT), stream)
    for token in tokens:
        reply.feed(token)
    reply.finish()
    assert reply.reasoning_steps == 3 and reply.reasoning() == "Look first." and reply.calls[0].name == "ls"
