"""What the serve benchmarks read off a server evaluation/serve_process.py started: the prompt
cache's dense rebuild finished, and the server's resident memory (the tests keep their own copy:
tests/serve/harness.py; neither side imports the other)."""
from __future__ import annotations

import time
from pathlib import Path

from specfill.evaluation.serve_process import ServerProcess


def wait_rebuilt(server: ServerProcess, seconds: float = 600) -> dict:
    """Poll /health until the prompt cache has no dense rebuild pending (or `seconds` pass); the last state."""
    deadline = time.monotonic() + seconds
    while (state := server.health())["prompt_cache"]["pending_tokens"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return state


def rss_kb(server: ServerProcess) -> int:
    """The server process's resident set (kB, /proc's VmRSS)."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS line")
