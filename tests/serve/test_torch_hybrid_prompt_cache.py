"""A torch hybrid (Qwen3.5's layout: gated delta-net layers beside gated attention, tiny random
weights, a transformers directory) served by `specfill serve --backend cuda --device cpu`: the
second turn of a chat reads the first turn from the prompt cache, at a point where the cache kept
the recurrent state (the end of the first prompt or a later step), and answers with the tokens of
a cold run (greedy, float32)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from specfill.evaluation.serve_process import ServerProcess, client  # noqa: E402
from tests.adapters.torch_archs import HYBRID, save_directory  # noqa: E402


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory: pytest.TempPathFactory):
    directory = save_directory(
        "qwen3_5_text",
        tmp_path_factory.mktemp("qwen3_5_text") / "model",
        dict(HYBRID["qwen3_5_text"], num_hidden_layers=4),
    )
    server = ServerProcess(
        "--backend",
        "cuda",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--model",
        str(directory),
        "--chat-template",
        "chatml",
        "--max-tokens",
        "12",
        log=tmp_path_factory.mktemp("serve") / "torch_hybrid.log",
    )
    yield server
    server.stop()


def chat(c, model: str, messages: list[dict], **fields):
    r = c.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0, extra_body=fields)
    return r.choices[0].message.content, r.model_extra["specfill"]


def test_a_second_turn_from_the_prompt_cache_equals_a_cold_run(hybrid_server):
    c = client(hybrid_server, timeout=120)
    turn1 = {"role": "user", "content": "alpha beta gamma delta " * 6}
    reply1, stats1 = chat(c, hybrid_server.model, [turn1])
    two_turns = [turn1, {"role": "assistant", "content": reply1}, {"role": "user", "content": "and epsilon?"}]
    reply2, stats2 = chat(c, hybrid_server.model, two_turns)
    assert stats2["cached_tokens"] >= stats1["prompt_tokens"] and stats2["prefill_method"] == "full"
    cold, stats_cold = chat(c, hybrid_server.model, two_turns, prompt_cache="off")
    assert stats_cold["cached_tokens"] == 0 and reply2 == cold
