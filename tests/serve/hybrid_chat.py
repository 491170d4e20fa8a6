"""The two-turn chat both hybrid serve tests run (tests/serve/test_hybrid_prompt_cache.py on MLX,
test_torch_hybrid_prompt_cache.py on torch): turn 2 from the prompt cache equals a cold run, in
one server and across a restart on one --prompt-cache-dir."""

from __future__ import annotations

import time
from pathlib import Path

from specfill.evaluation.serve_process import ServerProcess, client

TURN1 = {"role": "user", "content": "alpha beta gamma delta " * 6}


def chat(c, model: str, messages: list[dict], **fields):
    r = c.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0, extra_body=fields)
    return r.choices[0].message.content, r.model_extra["specfill"]


def two_turns(reply1: str) -> list[dict]:
    return [TURN1, {"role": "assistant", "content": reply1}, {"role": "user", "content": "and epsilon?"}]


def second_turn_equals_cold(server: ServerProcess) -> None:
    """Turn 2 reads at least turn 1's prompt from the cache and answers as a cold run."""
    c = client(server, timeout=120)
    reply1, stats1 = chat(c, server.model, [TURN1])
    reply2, stats2 = chat(c, server.model, two_turns(reply1))
    assert stats2["cached_tokens"] >= stats1["prompt_tokens"] and stats2["prefill_method"] == "full"
    cold, stats_cold = chat(c, server.model, two_turns(reply1), prompt_cache="off")
    assert stats_cold["cached_tokens"] == 0 and reply2 == cold


def restart_reads_first_turn(args: tuple[str, ...], tmp_path: Path) -> None:
    """Two server processes on one --prompt-cache-dir (in `args`, under tmp_path / "store"): the
    second's turn 2 reads turn 1's prompt from the file and equals a cold run; a file that is not a
    safetensors file is skipped with one log line. Logs: tmp_path / "one.log", "two.log"."""
    server = ServerProcess(*args, log=tmp_path / "one.log")
    try:
        c = client(server, timeout=120)
        reply1, stats1 = chat(c, server.model, [TURN1])
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
        reply2, stats2 = chat(c, server.model, two_turns(reply1))
        assert stats2["cached_tokens"] == stats1["prompt_tokens"] and stats2["prefill_method"] == "full"
        cold, stats_cold = chat(c, server.model, two_turns(reply1), prompt_cache="off")
        assert stats_cold["cached_tokens"] == 0 and reply2 == cold and server.alive()
    finally:
        server.stop()
    assert sum("junk.safetensors" in line for line in (tmp_path / "two.log").read_text().splitlines()) == 1
