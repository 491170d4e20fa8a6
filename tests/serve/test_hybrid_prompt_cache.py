"""A hybrid model (Qwen3.5's layout: gated delta-net layers beside gated attention, tiny random
weights, mlx-lm's directory) served by `specfill serve`: the second turn of a chat reads the first
turn from the prompt cache, at a point where the cache kept the recurrent state (the end of the
first prompt or a later step), and answers with the tokens of a cold run (greedy, float32); a
restarted server reads the first turn from its --prompt-cache-dir file and answers the same."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx_lm")

from specfill.evaluation.serve_process import ServerProcess  # noqa: E402
from tests.adapters.mlx_archs import HYBRID, save_directory  # noqa: E402
from tests.serve.hybrid_chat import restart_reads_first_turn, second_turn_equals_cold  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory: pytest.TempPathFactory):
    directory = save_directory(
        "qwen3_5", tmp_path_factory.mktemp("qwen3_5") / "model", dict(HYBRID["qwen3_5"], num_hidden_layers=4)
    )
    server = ServerProcess(
        "--backend",
        "mlx",
        "--model",
        str(directory),
        "--chat-template",
        "chatml",
        "--max-tokens",
        "12",
        log=tmp_path_factory.mktemp("serve") / "hybrid.log",
    )
    yield server
    server.stop()


def test_a_second_turn_from_the_prompt_cache_equals_a_cold_run(hybrid_server):
    second_turn_equals_cold(hybrid_server)


def test_a_restarted_server_reads_the_first_turn_from_disk(tmp_path):
    """Two server processes on one --prompt-cache-dir: the second's turn 2 reads the first turn's
    prompt (its KV and recurrent state at the prompt's end) from the file and equals a cold run."""
    directory = save_directory("qwen3_5", tmp_path / "model", dict(HYBRID["qwen3_5"], num_hidden_layers=4))
    args = ("--backend", "mlx", "--model", str(directory), "--chat-template", "chatml", "--max-tokens", "12")
    args += ("--prompt-cache-dir", str(tmp_path / "store"))
    restart_reads_first_turn(args, tmp_path)
