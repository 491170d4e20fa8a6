"""`specfill serve --prompt-cache-dir`: a conversation written to disk after its response is reused by
a restarted server (cached tokens, the same reply as without the cache); a broken file in the
directory is skipped with a log line."""

from __future__ import annotations

import time
import urllib.request

import pytest

from specfill.evaluation.serve_process import ServerProcess, client

pytestmark = pytest.mark.slow


def wait_saved(server: ServerProcess, seconds: float = 60) -> dict:
    deadline = time.monotonic() + seconds
    while (state := server.health()["prompt_cache"])["disk_entries"] < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    return state


@pytest.mark.parametrize("backend", ["cuda", "mlx"])
def test_a_restarted_server_reuses_its_saved_conversation(backend, tmp_path):
    pytest.importorskip("torch" if backend == "cuda" else "mlx.core")
    store = tmp_path / "store"
    args = (
        "--backend",
        backend,
        "--model",
        "random:tiny-llama",
        "--chat-template",
        "chatml",
        "--prompt-cache-dir",
        str(store),
        "--cache-memory",
        "0.5",
    )
    first = [{"role": "user", "content": " ".join(str(i) for i in range(3, 60))}]
    server = ServerProcess(*args, log=tmp_path / "one.log")
    try:
        c = client(server, timeout=120)
        one = c.chat.completions.create(model=server.model, messages=first, max_tokens=6, temperature=0)
        state = wait_saved(server)
        assert state["disk_entries"] == 1 and state["saved"] == 1 and state["disk_bytes"] > 0
    finally:
        server.stop()
    (store / "junk.safetensors").write_bytes(b"not a safetensors file")
    server = ServerProcess(*args, log=tmp_path / "two.log")
    try:
        state = server.health()["prompt_cache"]
        assert state["disk_entries"] == 1 and state["entries"] == 0  # on disk only until a prompt reuses it
        c = client(server, timeout=120)
        two_turns = first + [
            {"role": "assistant", "content": one.choices[0].message.content},
            {"role": "user", "content": "5 6 7"},
        ]
        cached = c.chat.completions.create(model=server.model, messages=two_turns, max_tokens=6, temperature=0)
        dense = c.chat.completions.create(
            model=server.model, messages=two_turns, max_tokens=6, temperature=0, extra_body={"prompt_cache": "off"}
        )
        assert cached.usage.prompt_tokens_details.cached_tokens > 50
        assert cached.choices[0].message.content == dense.choices[0].message.content
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "specfill_prompt_cache_disk_entries" in metrics and "specfill_prompt_cache_bytes" in metrics
        assert server.alive()
    finally:
        server.stop()  # inside the quiet spell a disk write waits for (WRITE_AFTER_S): written at the stop
    log = (tmp_path / "two.log").read_text()
    assert sum("junk.safetensors" in line for line in log.splitlines()) == 1
    server = ServerProcess(*args, log=tmp_path / "three.log")
    try:
        c = client(server, timeout=120)
        three_turns = two_turns + [
            {"role": "assistant", "content": cached.choices[0].message.content},
            {"role": "user", "content": "8 9"},
        ]
        third = c.chat.completions.create(model=server.model, messages=three_turns, max_tokens=2, temperature=0)
        assert third.usage.prompt_tokens_details.cached_tokens >= cached.usage.prompt_tokens  # turn 2 kept
    finally:
        server.stop()
