"""Torch hybrids (Qwen3.5's layout: gated delta-net layers beside gated attention; Jamba's: Mamba
layers run token by token over a continued step; MiniMax-Text-01's: lightning attention, its state
in MiniMaxCache; tiny random weights, a transformers directory) served by `specfill serve
--backend cuda --device cpu`: the second turn of a chat reads the first turn from the prompt
cache, at a point where the cache kept the recurrent state (the end of the first prompt or a
later step), and answers with the tokens of a cold run (greedy, float32)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from specfill.evaluation.serve_process import ServerProcess, client  # noqa: E402
from tests.adapters.torch_archs import HYBRID, save_directory  # noqa: E402

LAYOUTS = {"minimax": dict(layer_types=["linear_attention", "full_attention"] * 2)}


@pytest.fixture(scope="module", params=["qwen3_5_text", "jamba", "minimax"])
def hybrid_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    arch = request.param
    directory = save_directory(
        arch,
        tmp_path_factory.mktemp(arch) / "model",
        dict(HYBRID[arch], num_hidden_layers=4, **LAYOUTS.get(arch, {})),
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
