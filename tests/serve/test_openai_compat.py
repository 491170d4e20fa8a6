"""What users of vLLM / llama.cpp server expect (issue 25), driven with the official openai client on
the tiny model: model names and 404s, API keys, CORS, tokenize, the log line and /metrics, the port
bound before loading, and a clean stop on signals."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import time
import urllib.request
from unittest import mock

import openai
import pytest

from specfill.cli.main import main
from specfill.cli.serve import served_name
from specfill.evaluation.serve_process import ServerProcess, client, free_port

KEY = "sk-test-0123456789"
ORIGIN = "http://ui.example:3000"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model behind an API key from SPECFILL_API_KEY, one CORS origin, two served names, INFO log,
    prefill steps of 64 tokens."""
    server = ServerProcess(
        "--model",
        "random:tiny-llama",
        "--chat-template",
        "chatml",
        "--max-tokens",
        "8",
        "--served-model-name",
        "tiny",
        "tiny-alias",
        "--allowed-origins",
        ORIGIN,
        "--speculator",
        "self:1",
        "--prefill-step-size",
        "64",
        log=tmp_path_factory.mktemp("serve") / "keyed.log",
        log_level="info",
        env={"SPECFILL_API_KEY": KEY},
    )
    yield server
    server.stop()


def request(server, method: str, path: str, body: dict | None = None, headers: dict | None = None):
    """(status, headers, parsed JSON or text) of one plain HTTP request."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers or {})
    response = connection.getresponse()
    raw = response.read().decode()
    connection.close()
    try:
        return response.status, dict(response.getheaders()), json.loads(raw)
    except json.JSONDecodeError:
        return response.status, dict(response.getheaders()), raw


def test_default_served_names(tmp_path):
    gguf = tmp_path / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    gguf.write_bytes(b"")
    assert served_name(str(gguf)) == "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M"
    assert served_name(str(tmp_path)) == tmp_path.name
    assert served_name("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M") == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    assert served_name("random:tiny-llama") == "random:tiny-llama"


def test_unknown_model_is_404(tiny_server):
    c = client(tiny_server)
    assert c.models.retrieve(tiny_server.model).id == tiny_server.model
    with pytest.raises(openai.NotFoundError) as missing:
        c.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as wrong:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "1 2"}], max_tokens=2)
    assert wrong.value.code == "model_not_found" and "gpt-4o" in wrong.value.message
    status, _, reply = request(tiny_server, "POST", "/v1/completions", {"prompt": "1 2", "max_tokens": 2})
    assert status == 200 and reply["model"] == tiny_server.model  # an omitted model is the served one


def test_api_key(keyed_server):
    assert keyed_server.model == "tiny"
    with pytest.raises(openai.AuthenticationError) as refused:
        client(keyed_server).models.list()  # the helper's key is "none"
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    status, headers, body = request(keyed_server, "POST", "/v1/completions", {"prompt": "1"})
    assert status == 401 and set(body["error"]) == {"message", "type", "param", "code"}
    assert headers.get("www-authenticate") == "Bearer"
    c = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in c.models.list().data] == ["tiny", "tiny-alias"]
    assert c.completions.create(model="tiny-alias", prompt="1 2 3", max_tokens=3).usage.completion_tokens == 3
    assert request(keyed_server, "GET", "/health")[0] == 200  # probes need no key
    assert request(keyed_server, "HEAD", "/")[0] == 200  # Claude Code's, before its first request
    assert request(keyed_server, "GET", "/") == (200, mock.ANY, "specfill is running\n")
    assert request(keyed_server, "GET", "/metrics")[0] == 401


def test_beyond_loopback_without_key_warns(capsys):
    """Bound to every interface with no key: a loud warning (then the missing model ends the run)."""
    argv = ["serve", "--model", "/nonexistent/model.gguf", "--host", "0.0.0.0", "--port", str(free_port())]
    assert main(argv) == 2
    assert "WARNING: listening on 0.0.0.0" in capsys.readouterr().err
    assert main([*argv[:-1], str(free_port()), "--api-key", KEY]) == 2
    assert "WARNING" not in capsys.readouterr().err


def test_port_in_use_fails_before_loading(capsys):
    """The port is bound first: a busy port is the error even though the model could not load either."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--model", "/nonexistent/model.gguf", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"specfill: error: cannot listen on 127.0.0.1:{port}: the port is already in use"


def test_cors_and_options(keyed_server, tiny_server):
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    status, headers, _ = request(keyed_server, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN  # no key needed for a preflight
    status, headers, _ = request(
        keyed_server, "OPTIONS", "/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"}
    )
    assert status == 400 and "access-control-allow-origin" not in headers
    status, headers, _ = request(
        keyed_server, "GET", "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"}
    )
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    status, headers, _ = request(tiny_server, "OPTIONS", "/v1/completions", headers=preflight)
    assert status == 204 and "access-control-allow-origin" not in headers  # default: no origin allowed


def test_tokenize_and_detokenize(tiny_server):
    status, _, llama = request(tiny_server, "POST", "/tokenize", {"content": "4 5 6"})
    assert status == 200 and llama["tokens"] == [4, 5, 6] and llama["count"] == 3
    assert llama["max_model_len"] == 4096
    vllm = request(tiny_server, "POST", "/tokenize", {"model": tiny_server.model, "prompt": "4 5 6"})[2]
    assert vllm["tokens"][-3:] == [4, 5, 6]
    chat = request(tiny_server, "POST", "/tokenize", {"messages": [{"role": "user", "content": "4 5"}]})[2]
    done = client(tiny_server).chat.completions.create(
        model=tiny_server.model, max_tokens=1, messages=[{"role": "user", "content": "4 5"}]
    )
    assert chat["count"] == done.usage.prompt_tokens  # the same template as a chat request
    assert request(tiny_server, "POST", "/detokenize", {"tokens": [7, 8, 9]})[2] == {
        "content": "7 8 9",
        "prompt": "7 8 9",
    }
    status, _, bad = request(tiny_server, "POST", "/detokenize", {"tokens": [1, -4]})
    assert status == 400 and bad["error"]["param"] == "tokens"
    assert request(tiny_server, "POST", "/tokenize", {"content": "1", "model": "other"})[0] == 404


def test_log_line_and_metrics(keyed_server):
    c = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    c.completions.create(model="tiny", prompt="3 4 5 6", max_tokens=4, extra_body={"method": "h2o"})
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt="3 4", max_tokens=4, extra_body={"method": "nope"})
    lines = keyed_server.log.read_text().splitlines()
    ok = [line for line in lines if "outcome=ok" in line and "method=h2o->" in line]
    assert ok and re.match(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} INFO specfill.serve: cmpl-\w+ completion "
        r"method=h2o->\w+ prompt=4 cached=0 kept=4 ttft=[\d.]+s gen=4 tok/s=[\d.]+ ",
        ok[-1],
    )
    assert any("outcome=400 (method must be full, h2o, specprefill or auto, got 'nope'" in line for line in lines)
    status, headers, text = request(keyed_server, "GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert re.search(r'^specfill_requests_total\{outcome="ok"\} [1-9]', text, re.M)
    assert re.search(r'^specfill_requests_total\{outcome="400"\} [1-9]', text, re.M)
    assert re.search(r'^specfill_time_to_first_token_seconds_count\{method="\w+"\} [1-9]', text, re.M)
    assert re.search(r"^specfill_generated_tokens_total [1-9]", text, re.M)
    assert "specfill_queue_depth 0" in text


def test_progress_event_per_prefill_step(keyed_server):
    """--prefill-step-size 64: every method reports (and can be cancelled) every step: full prefill
    every 64 tokens, H2O every 64 (whole chunks of 32), SpecPrefill every speculator step of 64,
    every look-ahead token and every 64 kept tokens; `processed` stays on the prompt's scale."""
    c = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    prompt = " ".join(str(i % 400 + 3) for i in range(300))
    walk = [64, 128, 192, 256, 300]
    for method, extra in (
        ("full", {}),
        ("h2o", {"h2o_chunk_size": 32, "h2o_batch_size": 128}),
        ("specprefill", {"keep_ratio": 0.5}),
    ):
        chunks = list(
            c.completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=1,
                stream=True,
                extra_body={"method": method, "return_progress": True, "prompt_cache": "off", **extra},
            )
        )
        events = [ch.model_extra["prompt_progress"] for ch in chunks if "prompt_progress" in ch.model_extra]
        stages = [(e["stage"], e["stage_processed"], e["stage_total"]) for e in events]
        if method != "specprefill":
            assert stages == [("prefill", n, 300) for n in walk], method
            assert [e["processed"] for e in events] == walk, method
            continue
        kept = next(ch.model_extra["specfill"]["kept_tokens"] for ch in chunks if "specfill" in ch.model_extra)
        lookahead = [s for s in stages if s[0] == "lookahead"]
        assert stages[:5] == [("speculator", n, 300) for n in walk]
        assert lookahead == [("lookahead", i, 8) for i in range(1, len(lookahead) + 1)] and lookahead
        assert stages[5 + len(lookahead) :] == [("main_prefill", n, kept) for n in (64, 128, kept)]
        assert [e["processed"] for e in events] == walk + [300] * (len(events) - 5)


@pytest.mark.parametrize("signals", [1, 2])
def test_signals_stop_cleanly(tmp_path, signals):
    """Ctrl+C mid-stream (once: drain; twice: at once): the stream ends, exit status 0, no traceback.
    A client stalled in the middle of its request body gets a 503 at the first signal instead of
    holding the shutdown (uvicorn waited 30 s for it, then cancelled it with a traceback; after a
    second signal the event loop's teardown cancelled it, and uvicorn logged a CancelledError); one
    stalled on a route without that check is hung up on after a second signal, also quietly."""
    server = ServerProcess(
        "--model", "random:tiny-llama", "--max-tokens", "3000", log=tmp_path / "sig.log", log_level="info"
    )
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("POST", "/v1/completions", body=json.dumps({"prompt": "1 2", "stream": True}))
        response = connection.getresponse()
        assert response.status == 200 and response.readline()
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        tokenize = socket.create_connection(("127.0.0.1", server.port), timeout=60)  # no shutdown check there
        tokenize.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.5)  # their handlers wait for the rest of the body
        server.proc.send_signal(signal.SIGINT)
        if signals == 2:  # a second signal once the first is handled (two pending SIGINTs are one)
            deadline = time.monotonic() + 10
            while "specfill: stopping:" not in server.log.read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
            server.proc.send_signal(signal.SIGINT)
        tail = response.read().decode()  # the stream ends instead of running 3,000 tokens
        assert tail.rstrip().endswith("data: [DONE]")
        assert server.proc.wait(timeout=30) == 0
        refused = stalled.makefile("rb").read().decode()
        assert refused.startswith("HTTP/1.1 503") and "shutting down" in refused, refused
        if signals == 2:
            assert "specfill: stopping now" in server.log.read_text()
        log = server.log.read_text()
        assert "Traceback" not in log and "terminate called" not in log, log
        with pytest.raises(OSError):
            urllib.request.urlopen(server.url + "/health", timeout=5)
    finally:
        server.stop()
