"""The server a soak runs against (evaluation/soak.py): started (`specfill serve` on 127.0.0.1 and a free
port, its log in the results folder) or given by --url; its routes, tokenizer, log and process."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from .serve_process import ServerProcess
from .soak_cases import CHATML_TOOLS, RESPONSES
from .texts import eval_text


class SoakServer:
    """url, host, port, pid (None: not found), log_path (None: no log to read), headers (the API key),
    model, info (for the report), context, responses (whether /v1/responses exists)."""

    def __init__(self, args: argparse.Namespace, stem: Path):
        self.process: ServerProcess | None = None
        if args.url:
            parts = urllib.parse.urlsplit(args.url)
            self.host, self.port, self.url = parts.hostname, parts.port or 80, args.url.rstrip("/")
            self.log_path = Path(args.log) if args.log else None
            self.pid = listening_pid(self.port)
        else:
            serve = ["--dtype", args.dtype, "--max-tokens", str(args.max_tokens), "--max-queue", str(args.max_queue)]
            serve += ["--cache-memory", str(args.cache_memory), "--speculator", args.speculator]
            if args.model:
                serve += ["--model", args.model]
            if args.chat_template == "tools":
                template = stem.with_name(f"{args.name}_tools.jinja")
                template.write_text(CHATML_TOOLS, encoding="utf-8")
                serve += ["--chat-template", str(template)]
            elif args.chat_template != "own":
                serve += ["--chat-template", args.chat_template]
            serve += args.serve_args
            self.log_path = stem.with_name(f"{args.name}_server.log")
            self.process = ServerProcess(*serve, log=self.log_path, threads=args.threads, log_level="info")
            self.host, self.port, self.url, self.pid = (
                "127.0.0.1",
                self.process.port,
                self.process.url,
                self.process.proc.pid,
            )
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        health = self.get("/health")
        self.model = health["model"]
        self.info = {
            "url": self.url,
            "model": health["model"],
            "backend": health.get("backend"),
            "device": health.get("device"),
            "pid": self.pid,
            "log": None if self.log_path is None else str(self.log_path),
        }
        self.context = self.get("/v1/models")["data"][0].get("max_model_len") or 2048
        self.responses = self.has_route(RESPONSES)

    def get(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self.headers},
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            return json.loads(reply.read())

    def has_route(self, path: str) -> bool:
        """Whether the server has `path` (an empty body gets a 4xx, not 404 / 405)."""
        try:
            self.post(path, {})
        except urllib.error.HTTPError as err:
            return err.code not in (404, 405)
        return True

    def text_of(self, tokens: int) -> str:
        """The evaluation text cut to `tokens` tokens of the served tokenizer."""
        ids = self.post("/tokenize", {"content": eval_text(), "add_special": False})["tokens"][:tokens]
        return self.post("/detokenize", {"tokens": ids})["content"]

    def scan_log(self) -> dict[str, Any] | None:
        """Tracebacks in the server's log: how many, and the exception line of each (10 at most)."""
        if self.log_path is None or not self.log_path.exists():
            return None
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        errors = []
        for i in starts:
            tail = next((line for line in lines[i + 1 :] if line and not line.startswith((" ", "\t"))), "")
            errors.append(tail[:300])
        return {"count": len(starts), "errors": sorted(Counter(errors).items(), key=lambda kv: -kv[1])[:10]}

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.alive()
        try:
            return self.get("/health")["status"] == "ok"
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server the soak started (one given by --url runs on)."""
        if self.process is not None:
            self.process.stop()


def listening_pid(port: int) -> int | None:
    """The process listening on `port` (None when the system does not say)."""
    import psutil

    try:
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return conn.pid
    except psutil.Error:
        pass
    return None
