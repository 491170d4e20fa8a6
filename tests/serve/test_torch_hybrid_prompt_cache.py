"""Torch hybrids (Qwen3.5's layout: gated delta-net layers beside gated attention; Jamba's: Mamba
layers run token by token over a continued step; MiniMax-Text-01's: lightning attention, its state
in MiniMaxCache; tiny random weights, a transformers directory) served by `specfill serve
--backend cuda --device cpu`: the second turn of a chat reads the first turn from the prompt
cache, at a point where the cache kept the recurrent state (the end of the first prompt or a
later step), and answers with the tokens of a cold run (greedy, float32); a restarted server
reads the first turn from its --prompt-cache-dir file (backends/torch_cuda/hybrid_cache.py save /
load) and answers the same."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from specfill.evaluation.serve_process import ServerProcess  # noqa: E402
from tests.adapters.torch_archs import HYBRID, save_directory  # noqa: E402
from tests.serve.hybrid_chat import restart_reads_first_turn, second_turn_equals_cold  # noqa: E402

pytestmark = pytest.mark.slow

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


def test_a_second_turn_from_the_prompt_cache_equals_a_cold_run(hybrid_server):
    second_turn_equals_cold(hybrid_server)


def test_a_restarted_server_reads_the_first_turn_from_disk(tmp_path):
    """Two server processes on one --prompt-cache-dir: the second's turn 2 reads the first turn's
    prompt (its KV and recurrent state at the prompt's end) from the file and equals a cold run;
    a file that is not a safetensors file is skipped with one log line."""
    directory = save_directory("qwen3_5_text", tmp_path / "model", dict(HYBRID["qwen3_5_text"], num_hidden_layers=4))
    args = ("--backend", "cuda", "--device", "cpu", "--dtype", "float32", "--model", str(directory))
    args += ("--chat-template", "chatml", "--max-tokens", "12", "--prompt-cache-dir", str(tmp_path / "store"))
    restart_reads_first_turn(args, tmp_path)
    assert not any("cannot write" in line for line in (tmp_path / "one.log").read_text().splitlines())
