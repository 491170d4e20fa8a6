"""The agent-session benchmark (evaluation/agent_session.py) end to end on the rote tool model:
2 turns, small tool results, two servers (the session, then a restart on its --prompt-cache-dir)."""

from __future__ import annotations

import json

import pytest

from specfill.evaluation.agent_session import main, parser, source_files, tool_sizes

pytestmark = pytest.mark.slow


def test_tool_sizes_and_sources():
    assert tool_sizes("1000-4000", 6) == [1000, 2000, 3000, 4000, 1000, 2000]
    assert tool_sizes("64", 2) == [64, 64]
    for bad in ("0", "5-2", "x"):
        with pytest.raises(ValueError):
            tool_sizes(bad, 2)
    files = source_files(8000)
    assert files and all(len(text) >= 8000 and path.endswith(".py") for path, text in files)
    with pytest.raises(SystemExit):
        parser().parse_args([])  # --model is required


def test_two_turn_session_with_a_restart(tmp_path):
    from tests.fixtures.tool_model import write_tool_checkpoint

    checkpoint = write_tool_checkpoint(tmp_path / "tiny-tools")
    out = tmp_path / "out"
    argv = ["--model", str(checkpoint), "--threads", "1", "--turns", "2", "--tool-tokens", "32-64", "--out", str(out)]
    argv += ["--serve-args", "--no-lazy-grammar"]  # the rote call's get_weather is none of the agent's tools
    assert main(argv) == 0
    result = json.loads((out / "agent_session.json").read_text())
    one, two = result["turns"]
    assert [one["tool_tokens"], two["tool_tokens"]] == [32, 42] and one["path"] != two["path"]
    assert two["cached"]["prompt_tokens"] == two["cold"]["prompt_tokens"] > one["cached"]["prompt_tokens"]
    assert two["cached"]["cached_tokens"] > one["cached"]["prompt_tokens"] - 8  # turn 1's conversation reused
    assert two["cold"]["cached_tokens"] == 0 and one["equal"] and two["equal"]
    assert 'get_weather{"city": "Paris"}' == two["cached"]["reply"]  # the rote model's call, streamed
    assert result["saved"]["disk_entries"] >= 1
    first_after, last_after = result["restart"]
    assert last_after["order"] == 1 and last_after["cached_tokens"] == two["cached"]["prompt_tokens"] - 1  # disk
    assert first_after["cached_tokens"] >= one["cached"]["prompt_tokens"] - 1 and last_after["equal"]
    table = (out / "agent_session.md").read_text()
    assert table.startswith("# Agent session: 2 turns on tiny-tools (float32, ") and table.count("\n| ") == 3
    assert (out / "agent_session_ttft.png").stat().st_size > 0
    assert main(argv) == 0  # all measured: the rerun only rewrites the report (no server)
    assert json.loads((out / "agent_session.json").read_text())["turns"] == result["turns"]
    (out / "agent_session.json").write_text(json.dumps({**result, "turns": [one], "restart": []}))
    assert main(argv) == 0  # resumed after turn 1: turn 2 on a new server, its cache read from disk
    resumed = json.loads((out / "agent_session.json").read_text())
    assert (
        resumed["turns"][0] == one
        and resumed["turns"][1]["cached"]["cached_tokens"] >= one["cached"]["prompt_tokens"] - 1
    )
    assert resumed["turns"][1]["equal"] and len(resumed["restart"]) == 2
