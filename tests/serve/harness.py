"""The serve tests' helpers around a server evaluation/serve_process.py started: waiting for the prompt
cache's dense rebuild, the server's resident memory, and a raw POST (status and body, errors too)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
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


def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    """(status, JSON body) of a POST of `body` (raw bytes, or an object sent as JSON); an error status too."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
