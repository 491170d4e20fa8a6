"""evaluation/agent_turns.py (issue 46 item 7) without a server: the planted facts, the argument
checks, and the report from a run's JSON (the real run is results/agent_session/agent_turns_pair.*)."""

from __future__ import annotations

import json

import pytest

from specfill.evaluation import agent_turns


def test_each_turn_plants_its_own_fact_where_the_question_asks():
    text = "\n".join(f"line {i}" for i in range(100))
    facts = [agent_turns.fact(t) for t in range(6)]
    assert len({name for name, _ in facts}) == 6 and len({value for _, value in facts}) == 6
    for turn, (name, value) in enumerate(facts):
        lines = agent_turns.plant(text, turn).split("\n")
        assert lines.count(f"{name} = {value}") == 1 and len(lines) == 101
        assert lines.index(f"{name} = {value}") == int(100 * agent_turns.DEPTHS[turn])
        assert name in agent_turns.question(turn)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tool-tokens", "2000,x"], "--tool-tokens"),
        (["--tool-tokens", "0"], "--tool-tokens"),
        (["--methods", "full,h2o2"], "unknown h2o2"),
        (["--threads", "0"], "--threads"),
    ],
)
def test_bad_arguments_are_one_line_each(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        agent_turns.main(["--model", "m", "--speculator", "s", *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_auto_is_served_calibrated_before_it_listens():
    """`auto`'s server runs `--method auto` (calibrated at start, as a user's), so its first turn's TTFT
    holds no probe (one did: 11.6 of 28.2 s, results/cpu_bf16_turns/notes.md); the others name their method
    per request."""
    assert agent_turns.server_flags("auto") == ("--method", "auto")
    assert all(agent_turns.server_flags(tag) == () for tag in ("seed", "full", "specprefill", "nested"))


def test_report_from_a_run(tmp_path):
    pytest.importorskip("matplotlib")

    def row(turn, ttft, answered):
        return {
            "turn": turn, "ttft_s": ttft, "prompt_tokens": 100 * turn + 50, "cached_tokens": 100 * turn,
            "new_tokens": 50, "kept_tokens": 120, "answered": answered, "reply": "4", "idle_work_s": 1.0,
        }  # fmt: skip

    follow = {"cached_tokens": 300, "prompt_tokens": 320, "reply": "read_file"}
    result = {
        "settings": {"model": "/m/main.gguf", "speculator": "/m/small.gguf", "dtype": "float32", "threads": 2},
        "machine": {"cpu": "test", "cores": 2, "memory_gb": 1, "os": "Linux", "arch": "x86_64", "python": "3.11"},
        "server": {"backend": "cuda", "device": "cpu"},
        "seed": {"prompt_tokens": 90},
        "runs": {
            "full": {"turns": [row(1, 10.0, True), row(2, 20.0, True)], "follow_up": follow},
            "specprefill": {"turns": [row(1, 5.0, True), row(2, 8.0, False)], "follow_up": follow},
        },
    }
    result["runs"]["specprefill"]["turns"][1]["prefill_seconds"] = {"speculator": 3.04, "main_prefill": 4.5}
    result["runs"]["specprefill"]["turns"][1]["prefill_method"] = "specprefill"  # what the server ran
    (tmp_path / "r.json").write_text(json.dumps(result))
    paths = agent_turns.write_report(result, tmp_path, "r")
    table = (tmp_path / "r.md").read_text()
    assert "| specprefill | specprefill | 2 | 250 | 200 | 50 | 120 | 8.00 | 2.50 | False |" in table
    assert "| full |  | 1 |" in table  # a row without the field (a run before it)
    assert "| 1.0 | main_prefill 4.5, speculator 3.0 |" in table  # the parts, largest first
    assert "| 1.0 |  |" in table  # a row without parts (a run before the field)
    assert "specprefill: cached 300 of 320, reply 'read_file', equal to full: True" in table
    assert paths[-1].exists() and paths[-1].stat().st_size > 1000


def test_every_method_sends_request_fields_the_server_takes():
    from specfill.core.request import SETTINGS

    fields = {s.server for s in SETTINGS if s.server}  # "method" among them
    for name, body in agent_turns.METHODS.items():
        assert set(body) <= fields, (name, set(body) - fields)
    assert agent_turns.METHODS["nested"] == {"method": "specprefill", "deep_keep": 0.3, "deep_from": 0.5}
