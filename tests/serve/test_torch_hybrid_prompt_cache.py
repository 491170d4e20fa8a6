"""Torch hybrids (Qwen3.5's layout: gated delta-net layers beside gated attention; Jamba's: Mamba
layers run token by token over a continued step; MiniMax-Text-01's: lightning attention, its state
in MiniMaxCache; tiny random weights, a transformers directory) served by `specfill serve
--backend cuda --device cpu`: the second turn of a chat reads the first turn from the prompt
cache, at a point where the cache kept the recurrent state (the end of the first prompt or a
later step), and answers with the tokens of a cold run (greedy, float32); a restarted server
reads the first turn from its --prompt-cache-dir file (backends/torch_cuda/hybrid_cache.py save /
load) and answers the same."""

from __future__ import annotations

import time

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


def test_a_restarted_server_reads_the_first_turn_from_disk(tmp_path):
    """Two server processes on one --prompt-cache-dir: the second's turn 2 reads the first turn's
    prompt (its KV and recurrent state at the prompt's end) from the file and equals a cold run;
    a file that is not a safetensors file is skipped with one log line."""
    directory = save_directory("qwen3_5_text", tmp_path / "model", dict(HYBRID["qwen3_5_text"], num_hidden_layers=4))
    args = ("--backend", "cuda", "--device", "cpu", "--dtype", "float32", "--model", str(directory))
    args += ("--chat-template", "chatml", "--max-tokens", "12", "--prompt-cache-dir", str(tmp_path / "store"))
    turn1 = {"role": "user", "content": "alpha beta gamma delta " * 6}
    server = ServerProcess(*args, log=tmp_path / "one.log")
    try:
        c = client(server, timeout=120)
        reply1, stats1 = chat(c, server.model, [turn1])
        deadline = time.monotonic() + 60
        while server.health()["prompt_cache"]["disk_entries"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        server.stop()
    (tmp_path / "store" / "junk.safetensors").write_bytes(b"not a safetensors file")
    server = ServerProcess(*args, log=tmp_path / "two.log")
    try:
        assert server.health()["prompt_cache"]["disk_entries"] == 1
        c = client(server, timeout=120)
        two_turns = [turn1, {"role": "assistant", "content": reply1}, {"role": "user", "content": "and epsilon?"}]
        reply2, stats2 = chat(c, server.model, two_turns)
        assert stats2["cached_tokens"] == stats1["prompt_tokens"] and stats2["prefill_method"] == "full"
        cold, stats_cold = chat(c, server.model, two_turns, prompt_cache="off")
        assert stats_cold["cached_tokens"] == 0 and reply2 == cold and server.alive()
    finally:
        server.stop()
    assert sum("junk.safetensors" in line for line in (tmp_path / "two.log").read_text().splitlines()) == 1
    assert not any("cannot write" in line for line in (tmp_path / "one.log").read_text().splitlines())
