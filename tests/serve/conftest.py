"""Servers shared by the serve tests: a tiny random model, the rote tool model and the demo model
(one process each)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from specfill.evaluation.serve_process import ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory):
    """random:tiny-llama (no chat template of its own: chatml), self:1 speculator, queue of 3."""
    server = ServerProcess(
        "--model",
        "random:tiny-llama",
        "--chat-template",
        "chatml",
        "--speculator",
        "self:1",
        "--max-queue",
        "3",
        "--max-tokens",
        "16",
        log=tmp_path_factory.mktemp("serve") / "tiny.log",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory):
    """The demo model (SmolLM2-135M-Instruct), self:8 speculator, full prefill by default, queue of 3."""
    server = ServerProcess(
        "--dtype",
        "float32",  # the exact cache's replies equal dense runs in float32 (bf16 rounds chunk by chunk)
        "--speculator",
        "self:8",
        "--max-tokens",
        "32",
        "--max-queue",
        "3",
        log=tmp_path_factory.mktemp("serve") / "demo.log",
    )
    yield server
    server.stop()


TOOL_KEY = "sk-tools-0123456789"


@pytest.fixture(scope="session")
def tool_server(tmp_path_factory: pytest.TempPathFactory):
    """The rote tool model (tests/fixtures/tool_model.py: a Qwen2.5-style template with tools) behind
    an API key, for the tool-call and Anthropic-route tests."""
    from tests.fixtures.tool_model import write_tool_checkpoint

    checkpoint = write_tool_checkpoint(tmp_path_factory.mktemp("tools") / "tiny-tools")
    server = ServerProcess(
        "--model",
        str(checkpoint),
        "--max-tokens",
        "32",
        "--api-key",
        TOOL_KEY,
        log=tmp_path_factory.mktemp("serve") / "tools.log",
    )
    server.checkpoint = checkpoint
    yield server
    server.stop()
