"""A real `specfill serve` in a subprocess on 127.0.0.1 and a free port, and the `openai` client on it:
what the soak (soak_server.py) and the agent session (agent_session.py) start and talk to. The serve
tests and research/serve use it as any user would; their own helpers (the prompt cache's rebuild
wait, the server's resident memory) are theirs (tests/serve/harness.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`specfill --threads T serve ARGS --port P`; `url` is http://127.0.0.1:P, `proc` the process."""

    def __init__(
        self,
        *args: str,
        log: Path,
        threads: int = 1,
        log_level: str = "warning",
        env: dict[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specfill.cli.main",
                "--threads",
                str(threads),
                "serve",
                *args,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                log_level,
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self._wait_ready(start_timeout)
        self.model = self.health()["model"]  # the served model name requests must use

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"specfill serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"specfill serve did not answer /health in {timeout} s:\n{self.log.read_text()}")

    def health(self) -> dict:
        """GET /health as a dict (busy, waiting, served, prompt_cache statistics, ...)."""
        with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
            return json.loads(r.read())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


def client(server: ServerProcess, **options: Any) -> Any:
    """The official `openai` client on the server, no retries (a 503 must show as a 503)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, **options)
