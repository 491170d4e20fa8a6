"""A reply's control tokens write no text (serve/reply_text.py), as vLLM's skip_special_tokens and
llama.cpp's server have it, except the markers its tool-call format and reasoning are read by: the
ids each chat template hides, the streaming detokenizer's hidden ids, and a rote model behind the
server that writes <|im_start|> in the middle of its reply."""

from __future__ import annotations

import pytest

from specfill.core.io.tokenizer import Tokenizer
from specfill.evaluation.serve_process import ServerProcess, client
from specfill.evaluation.soak_cases import CHATML_TOOLS
from specfill.serve.reply_text import hidden_token_ids
from specfill.serve.tool_parsers import HARMONY, KIMI_K2, MISTRAL
from tests.fixtures.tiny_tokenizer import BOS_TOKEN, EOS_TOKEN
from tests.fixtures.tool_model import rote_tokenizer, write_rote_checkpoint

from .harness import post

CONTROL = ("<|fim_pad|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "[ARGS]", "<|channel|>", "<|message|>")
KIMI = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")


def tokenizer(template: str, specials: tuple[str, ...] = CONTROL) -> Tokenizer:
    backend = rote_tokenizer(specials, ("Hello",))
    return Tokenizer(
        backend,
        bos_token_id=backend.token_to_id(BOS_TOKEN),
        eos_token_ids=[backend.token_to_id(EOS_TOKEN)],
        chat_template=template,
    )


def hidden_texts(tok: Tokenizer) -> set[str]:
    return {tok.token_text(i) for i in hidden_token_ids(tok)}


def own_specials(tok: Tokenizer) -> set[str]:
    """The tiny vocabulary's own control tokens (<|im_start|>, <|im_end|>, <|endoftext|>)."""
    texts = {tok.token_text(i) for i in tok.special_token_ids} - set(CONTROL)
    assert {BOS_TOKEN, EOS_TOKEN} <= texts
    return texts


def test_a_hermes_template_hides_turn_markers_and_keeps_its_calls_and_reasoning():
    tok = tokenizer(CHATML_TOOLS)
    assert hidden_texts(tok) == own_specials(tok) | {"<|fim_pad|>", "[ARGS]", "<|channel|>", "<|message|>"}


def test_other_formats_keep_the_control_tokens_their_readers_read():
    assert "[ARGS]" not in hidden_texts(tokenizer("[TOOL_CALLS] {{ tools }}"))
    kimi = tokenizer("<|tool_calls_section_begin|> {{ tools }}", CONTROL + KIMI)
    assert not hidden_texts(kimi) & set(KIMI)
    assert "<|tool_call_end|>" in KIMI_K2.call[1] and "[ARGS]" in MISTRAL.texts
    # no template: nothing is read but the reasoning tags
    bare = tokenizer("")
    assert hidden_texts(bare) == own_specials(bare) | set(CONTROL) - {"<think>", "</think>"}


def test_a_harmony_reply_keeps_every_control_token_but_its_ends():
    tok = tokenizer("<|channel|> <|message|> {{ tools }}")
    assert HARMONY.messages
    assert hidden_texts(tok) == {EOS_TOKEN}


def test_the_streaming_detokenizer_writes_nothing_for_hidden_ids():
    tok = tokenizer(CHATML_TOOLS)
    ids = tok.encode("Hello<|im_start|> there<|fim_pad|>!", add_special_tokens=False)
    hidden = hidden_token_ids(tok)
    assert len(set(ids) & hidden) == 2
    stream = tok.streaming_detokenizer(hidden=hidden)
    text = "".join(stream.add_token(i) for i in ids) + stream.finish()
    assert text == "Hello there!" == tok.decode([i for i in ids if i not in hidden])
    raw = tok.streaming_detokenizer()
    assert "".join(raw.add_token(i) for i in ids) + raw.finish() == "Hello<|im_start|> there<|fim_pad|>!"


# the rote model: after the generation prompt's "\n" it thinks, says Hello, writes a turn's opening
# (<|im_start|>, a control token) and goes on
REPLY = {"Ċ": "<think>", "<think>": "Hmm", "Hmm": "</think>", "</think>": "Hello", "Hello": BOS_TOKEN,
         BOS_TOKEN: " world", " world": EOS_TOKEN}  # fmt: skip


@pytest.fixture(scope="module")
def rote_server(tmp_path_factory: pytest.TempPathFactory):
    checkpoint = write_rote_checkpoint(
        tmp_path_factory.mktemp("rote") / "rote",
        CHATML_TOOLS,
        REPLY,
        ("<think>", "</think>"),
        ("Hmm", "Hello", " world"),
    )
    server = ServerProcess(
        "--model",
        str(checkpoint),
        "--served-model-name",
        "m",
        "--max-tokens",
        "16",
        log=checkpoint.parent / "serve.log",
    )
    yield server
    server.stop()


def test_the_server_leaves_a_control_token_out_of_the_reply(rote_server):
    messages = [{"role": "user", "content": "hi"}]
    api = client(rote_server)
    reply = api.chat.completions.create(model="m", messages=messages, max_tokens=16)
    assert reply.choices[0].message.content == "<think>Hmm</think>Hello world"
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == 7
    chunks = api.chat.completions.create(model="m", messages=messages, max_tokens=16, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "<think>Hmm</think>Hello world"
    status, raw = post(
        rote_server.url + "/v1/chat/completions",
        {"messages": messages, "max_tokens": 16, "skip_special_tokens": False},
    )
    assert status == 200 and raw["choices"][0]["message"]["content"] == "<think>Hmm</think>Hello<|im_start|> world"
    # a stop string that is a hidden token's text still stops the reply there, as it would in the raw text
    stopped = api.chat.completions.create(model="m", messages=messages, max_tokens=16, stop=["<|im_start|>"])
    assert stopped.choices[0].message.content == "<think>Hmm</think>Hello"
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 5
    body = {"model": "m", "max_tokens": 16, "messages": messages, "stop_sequences": ["im_start"]}
    status, anthropic = post(rote_server.url + "/v1/messages", body)
    assert status == 200 and anthropic["stop_reason"] == "stop_sequence" and anthropic["stop_sequence"] == "im_start"
    status, bad = post(rote_server.url + "/v1/chat/completions", {"messages": messages, "skip_special_tokens": "no"})
    assert status == 400 and "skip_special_tokens" in bad["error"]["message"]
