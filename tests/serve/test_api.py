"""specfill serve through the official openai client: chat and completions, streamed and not,
statistics, per-request methods, progress events, stop strings."""

from __future__ import annotations

from specfill.evaluation.serve_process import client

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_and_health(tiny_server):
    models = client(tiny_server).models.list()
    assert [m.id for m in models.data] == ["random:tiny-llama"]
    health = tiny_server.health()
    assert health["status"] == "ok" and health["model"] == "random:tiny-llama"


def test_tiny_completion_and_chat(tiny_server):
    c = client(tiny_server)
    done = c.completions.create(model=tiny_server.model, prompt="1 2 3 4 5", max_tokens=6, temperature=0)
    assert done.object == "text_completion" and done.choices[0].finish_reason == "length"
    assert done.usage.prompt_tokens == 5 and done.usage.completion_tokens == 6
    assert len(done.choices[0].text.split()) == 6  # the id tokenizer: one word per token
    ids = c.completions.create(model=tiny_server.model, prompt=[1, 2, 3, 4, 5], max_tokens=6)
    assert ids.choices[0].text == done.choices[0].text  # token ids and their text are one prompt
    chat = c.chat.completions.create(
        model=tiny_server.model, messages=[{"role": "user", "content": "7 8 9"}], max_tokens=4
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 4 and chat.usage.total_tokens == chat.usage.prompt_tokens + 4


def test_draft_tokens_per_request_keep_the_greedy_text(tiny_server):
    """num_draft_tokens (in extra_body): the server's speculator drafts; greedy text unchanged."""
    c = client(tiny_server)
    for method in ("full", "specprefill"):
        plain = c.completions.create(
            model=tiny_server.model,
            prompt="4 5 6 7 8 9",
            max_tokens=8,
            temperature=0,
            extra_body={"method": method, "prompt_cache": "off"},
        )
        drafted = c.completions.create(
            model=tiny_server.model,
            prompt="4 5 6 7 8 9",
            max_tokens=8,
            temperature=0,
            extra_body={"method": method, "prompt_cache": "off", "num_draft_tokens": 3},
        )
        assert drafted.choices[0].text == plain.choices[0].text, method


def test_tiny_streams_equal_whole(tiny_server):
    c = client(tiny_server)
    whole = c.completions.create(model=tiny_server.model, prompt="3 1 4 1 5", max_tokens=8)
    chunks = list(
        c.completions.create(
            model=tiny_server.model,
            prompt="3 1 4 1 5",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(final) == 1 and final[0].model_extra["specfill"]["generation_tokens"] == 8
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []
    chat = list(
        c.chat.completions.create(
            model=tiny_server.model, messages=[{"role": "user", "content": "2 7"}], max_tokens=5, stream=True
        )
    )
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices[0].finish_reason == "length" and "ttft_s" in chat[-1].model_extra["specfill"]


def test_progress_events_are_opt_in(tiny_server):
    c = client(tiny_server)
    prompt = " ".join(str(i % 500) for i in range(300))
    plain = list(c.completions.create(model=tiny_server.model, prompt=prompt, max_tokens=2, stream=True))
    assert not any("prompt_progress" in (ch.model_extra or {}) for ch in plain)
    chunks = list(
        c.completions.create(
            model=tiny_server.model,
            prompt=prompt,
            max_tokens=2,
            stream=True,
            extra_body={
                "return_progress": True,
                "method": "h2o",
                "prompt_cache": "off",
                "h2o_chunk_size": 64,
                "h2o_batch_size": 128,
                "h2o_local": 8,
                "h2o_heavy": 8,
            },
        )
    )
    progress = [ch.model_extra["prompt_progress"] for ch in chunks if "prompt_progress" in ch.model_extra]
    assert [p["processed"] for p in progress] == [128, 256, 300]  # steps: whole chunks, at most a logical batch
    assert all(p["total"] == 300 for p in progress)
    first_text = next(i for i, ch in enumerate(chunks) if ch.choices and ch.choices[0].text)
    assert first_text > max(i for i, ch in enumerate(chunks) if "prompt_progress" in ch.model_extra)


def test_stop_strings_cut_the_text(tiny_server):
    c = client(tiny_server)
    full = c.completions.create(model=tiny_server.model, prompt="9 9 9", max_tokens=8).choices[0].text
    words = full.split()
    stop = " " + words[2]
    cut = c.completions.create(model=tiny_server.model, prompt="9 9 9", max_tokens=8, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.find(stop)]
    streamed = c.completions.create(model=tiny_server.model, prompt="9 9 9", max_tokens=8, stop=stop, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == cut.choices[0].text


def test_demo_chat_answers(demo_server):
    c = client(demo_server)
    answer = c.chat.completions.create(model=demo_server.model, messages=QUESTION, max_tokens=12, temperature=0)
    assert "Paris" in answer.choices[0].message.content  # the chat template was applied server-side
    streamed = c.chat.completions.create(model=demo_server.model, messages=QUESTION, max_tokens=12, stream=True)
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == answer.choices[0].message.content
    )
    text = c.completions.create(model=demo_server.model, prompt="The capital of France is", max_tokens=4)
    assert text.usage.prompt_tokens == 5 and text.choices[0].text


def test_demo_method_per_request(demo_server):
    """The same prompt under each method; the statistics name it and SpecPrefill keeps fewer tokens."""
    c = client(demo_server)
    messages = [{"role": "user", "content": "Summarise: " + "The quick brown fox jumps over the lazy dog. " * 30}]
    seen = {}
    for method, extra in (
        ("full", {}),
        ("h2o", {"h2o_chunk_size": 128, "h2o_batch_size": 128, "h2o_local": 16, "h2o_heavy": 16}),
        ("specprefill", {"keep_ratio": 0.25}),
    ):
        r = c.chat.completions.create(
            model=demo_server.model,
            messages=messages,
            max_tokens=3,
            extra_body={"method": method, "prompt_cache": "off", **extra},
        )
        seen[method] = r.model_extra["specfill"]
    assert {m: s["method"] for m, s in seen.items()} == {"full": "full", "h2o": "h2o", "specprefill": "specprefill"}
    prompt_tokens = seen["full"]["prompt_tokens"]
    assert prompt_tokens > 300
    assert seen["full"]["kept_tokens"] == seen["h2o"]["kept_tokens"] == prompt_tokens
    assert seen["specprefill"]["kept_tokens"] < prompt_tokens / 2
    assert "speculator" in seen["specprefill"]["prefill_seconds"]
