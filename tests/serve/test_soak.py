"""The soak harness (evaluation/soak.py, issue 48) for a few seconds: two clients on the tiny model with
every action and the hostile corpus; every check passes, the report is complete."""

from __future__ import annotations

import json

import pytest

from specfill.evaluation import soak
from specfill.evaluation.soak_cases import hostile_cases, valid_cases
from specfill.evaluation.soak_client import StreamReader, whole_answer


@pytest.mark.slow
def test_short_soak_passes(tmp_path):
    argv = ["--model", "random:tiny-llama", "--speculator", "self:1", "--clients", "2", "--minutes", "0.2"]
    argv += [
        "--max-tokens",
        "6",
        "--max-queue",
        "3",
        "--deadline",
        "30",
        "--report-seconds",
        "3",
        "--out",
        str(tmp_path),
    ]
    code = soak.main(argv)
    result = json.loads((tmp_path / "soak.json").read_text())
    report = (tmp_path / "soak.md").read_text()
    assert code == 0 and result["passed"], report
    checks = result["checks"]
    assert all(c["ok"] is True for c in checks.values()), checks  # none left unrun on a server the soak started
    assert result["quiet"]["answers"] == len(valid_cases(6, "m", "l", result["responses_route"]))
    summary = result["summary"]
    assert set(summary["by_action"]) == set(soak.ACTIONS), summary["by_action"]
    assert sum(summary["by_outcome"].values()) == summary["load_requests"] >= 40
    assert summary["by_action"]["hang-up-mid-prefill"].get("hung up mid-prefill"), summary["by_action"]
    assert any(k.startswith("4") for k in summary["by_action"]["hostile"])
    assert result["memory"]["samples"] >= 10 and result["memory"]["final_mb"] > 0
    requests = (tmp_path / "soak_requests.jsonl").read_text().splitlines()
    assert len(requests) == summary["requests"]
    assert (tmp_path / "soak_memory.png").stat().st_size > 10_000
    assert "| no traceback in the server log | yes |" in report


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--url", "http://192.168.1.5:8080"], "--url must be http:// on a loopback address"),
        (["--url", "http://127.0.0.1:8080", "--model", "x"], "give them or --url, not both"),
        (["--log", "server.log"], "--log names a running server's log"),
        (["--clients", "0"], "--clients must be 1-64, got 0"),
        (["--minutes", "1000"], "--minutes must be in (0, 240], got 1000.0"),
        (["--deadline", "nan"], "--deadline must be a positive number, got nan"),
        (["--chat-template", "/nonexistent.jinja"], "--chat-template must be tools, own or a Jinja file"),
    ],
)
def test_bad_arguments_are_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as stopped:
        soak.main(argv)
    assert stopped.value.code == 2
    assert words in capsys.readouterr().err.strip().splitlines()[-1]


def test_stream_and_whole_answers_read_alike():
    """A tool call read from a whole body and from its stream (the model's own argument text, in
    pieces) is the same answer, on the OpenAI and the Anthropic routes."""
    whole = {
        "choices": [
            {
                "message": {
                    "content": "Let me look.",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Paris", "a": 1}'}}],
                }
            }
        ]
    }
    reader = StreamReader("/v1/chat/completions")
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"prompt_progress": {"processed": 5, "total": 9}, "choices": []},
        {"choices": [{"delta": {"content": "Let me look."}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1, '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"city": "Paris"}'}}]}}]},
    ]
    for chunk in [*map(json.dumps, chunks), "[DONE]"]:
        reader.line(f"data: {chunk}\n".encode())
        reader.line(b"\n")
    assert reader.done and reader.progressed and reader.deltas == 3
    assert reader.answer() == whole_answer("/v1/chat/completions", whole)
    assert reader.answer() == 'Let me look.\n<call get_weather {"a": 1, "city": "Paris"}>'
    anthropic = StreamReader("/v1/messages")
    events = [
        ("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "name": "get_weather"}}),
        (
            "content_block_delta",
            {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"city": "Paris"'}},
        ),
        ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": ', "a": 1}'}}),
        ("error", {"error": {"type": "api_error", "message": "boom"}}),
    ]
    for kind, data in events:
        for line in (f"event: {kind}", f"data: {json.dumps({'type': kind, **data})}", ""):
            anthropic.line(f"{line}\n".encode())
    assert anthropic.answer() == '\n<call get_weather {"a": 1, "city": "Paris"}>'
    assert (anthropic.error, anthropic.error_status, anthropic.done) == ("boom", 500, False)


def test_corpus_names_are_unique():
    """The quiet answers and the report key requests by name: two cases of one name would mix."""
    for responses in (False, True):
        names = [c.name for c in valid_cases(8, "m", "l", responses)]
        names += [c.name for c in hostile_cases(responses)]
        assert len(names) == len(set(names))
