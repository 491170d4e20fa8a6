"""`specfill serve` on the MLX backend, and its command-line errors (one line, exit 2)."""

from __future__ import annotations

import pytest

from specfill.cli.main import main
from specfill.evaluation.serve_process import ServerProcess, client
from tests.serve.harness import wait_rebuilt


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--max-queue", "0"], "--max-queue must be >= 1"),
        (["--cache-tokens", "0"], "--cache-tokens must be >= 1"),
        (["--cache-memory", "-1"], "--cache-memory must be a finite number of GB > 0, got -1.0"),
        (["--cache-memory", "nan"], "--cache-memory must be a finite number of GB > 0"),
        (["--cache-memory", "inf"], "--cache-memory must be a finite number of GB > 0"),
        (["--cache-disk", "0"], "--cache-disk must be a finite number of GB > 0, got 0.0"),
        (["--max-tokens", "0"], "max_tokens must be an integer >= 1"),
        (["--prefill-step-size", "0"], "--prefill-step-size must be >= 1"),
        (["--top-k", "-2"], "top_k must be >= 0"),
        (["--method", "specprefill"], "needs --speculator"),
        (["--chat-template", "/nonexistent/template.jinja"], "cannot read --chat-template"),
        (["--chat-template-kwargs", "{bad"], "--chat-template-kwargs must be a JSON object: Expecting"),
        (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs must be a JSON object, got list"),
        (["--chat-template-kwargs", '{"messages": []}'], "the server sets the template's messages"),
    ],
)
def test_bad_options_are_one_line(argv, words, capsys):
    assert main(["serve", "--model", "random:tiny-llama", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specfill: error: ") and words in err[-1]


def test_mlx_backend_serves_and_caches(tmp_path):
    pytest.importorskip("mlx.core")
    server = ServerProcess(
        "--backend",
        "mlx",
        "--model",
        "random:tiny-llama",
        "--chat-template",
        "chatml",
        "--speculator",
        "self:1",
        log=tmp_path / "mlx.log",
    )
    try:
        c = client(server, timeout=120)
        first = [{"role": "user", "content": " ".join(str(i) for i in range(3, 80))}]
        one = c.chat.completions.create(
            model=server.model, messages=first, max_tokens=6, extra_body={"method": "specprefill", "keep_ratio": 0.3}
        )
        assert one.model_extra["specfill"]["kept_tokens"] < one.usage.prompt_tokens
        two_turns = first + [
            {"role": "assistant", "content": one.choices[0].message.content},
            {"role": "user", "content": "5 6 7"},
        ]
        assert wait_rebuilt(server, 60)["prompt_cache"]["pending_tokens"] == 0
        cached = c.chat.completions.create(model=server.model, messages=two_turns, max_tokens=6)
        dense = c.chat.completions.create(
            model=server.model, messages=two_turns, max_tokens=6, extra_body={"prompt_cache": "off"}
        )
        assert cached.usage.prompt_tokens_details.cached_tokens > 70
        assert cached.choices[0].message.content == dense.choices[0].message.content
        streamed = c.completions.create(model=server.model, prompt="1 2 3", max_tokens=4, stream=True)
        assert len("".join(ch.choices[0].text for ch in streamed if ch.choices).split()) == 4
    finally:
        server.stop()
