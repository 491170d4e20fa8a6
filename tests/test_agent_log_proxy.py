"""scripts/agent_log_proxy.py's --summary: one row per POST, from the Messages, Responses and Chat Completions
streams it logged, and an error body's message."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("agent_log_proxy", ROOT / "scripts" / "agent_log_proxy.py")
assert _spec is not None and _spec.loader is not None
proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proxy)


def _stream(*events: dict) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def test_summary_reads_chat_completions_streams_and_errors(tmp_path):
    chunk = {"object": "chat.completion.chunk", "choices": []}
    answer = _stream(
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Reading "}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"content": "it."}}]},
        {
            **chunk,
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"name": "read_file", "arguments": ""}}]},
                }
            ],
        },
        {
            **chunk,
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"p": 1}'}}]}}],
        },
        {
            **chunk,
            "usage": {"prompt_tokens": 120, "prompt_tokens_details": {"cached_tokens": 100}},
            "specfill": {"ttft_s": 0.5},
        },
    )
    error = {"error": {"message": "prompt of 9 tokens plus max_tokens 99 exceeds the model's context of 8 tokens"}}
    log = tmp_path / "log.jsonl"
    records = [
        {"time": "2026-12-04T13:20:20", "method": "POST", "path": "/v1/chat/completions", "status": 200,
         "seconds": 1.5, "answer": answer},
        {"time": "2026-12-04T13:20:22", "method": "GET", "path": "/v1/models", "status": 200, "answer": "{}"},
        {"time": "2026-12-04T13:20:23", "method": "POST", "path": "/v1/chat/completions", "status": 400,
         "seconds": 0.1, "answer": json.dumps(error)},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = proxy.summary(log).splitlines()
    assert len(rows) == 4
    assert rows[2] == (
        "| 13:20:20 | /v1/chat/completions | 200 | 1.5 | 120 | 100 | 0.5 | 'Reading it.'; call read_file({\"p\": 1}) |"
    )
    assert rows[3].endswith("| error: prompt of 9 tokens plus max_tokens 99 exceeds the model's context of 8 tokens |")
