"""Servers shared by the serve tests: a tiny random model and the demo model (one process each)."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from specfill.evaluation.serve_process import ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory):
    """random:tiny-llama (no chat template of its own: chatml), self:1 speculator, queue of 3."""
    server = ServerProcess("--model", "random:tiny-llama", "--chat-template", "chatml", "--speculator", "self:1",
                           "--max-queue", "3", "--max-tokens", "16",
                           log=tmp_path_factory.mktemp("serve") / "tiny.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory):
    """The demo model (SmolLM2-135M-Instruct), self:8 speculator, full prefill by default, queue of 3."""
    server = ServerProcess("--speculator", "self:8", "--max-tokens", "32", "--max-queue", "3",
                           log=tmp_path_factory.mktemp("serve") / "demo.log")
    yield server
    server.stop()
