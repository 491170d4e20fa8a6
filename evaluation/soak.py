"""A soak of `specfill serve` (issue 48): N clients for M minutes against one live server on this machine,
then checks of what they got and of the server's log and memory.

    python -m specfill.evaluation.soak [--model M] [--dtype float32] [--threads 2] [--clients 8]
        [--minutes 10] [--max-tokens 24] [--deadline 120] [--out results/soak] [--name soak]
    python -m specfill.evaluation.soak --url http://127.0.0.1:8080 [--log SERVER_LOG] ...

Without --url it starts `specfill serve` (the demo model unless --model; the soak's ChatML template
with tools unless --chat-template own|FILE; --max-queue, --cache-memory, a self:8 speculator) on
127.0.0.1 and a free port, and stops it at the end; with --url it uses a server already running on
a loopback address (the process listening on its port is found for the memory samples; --log names
its log for the traceback check). Loopback only: the soak sends hostile bodies.

First a quiet run: every valid request (soak_cases.valid_cases: chat, messages, completions, and
responses when the server has that route, each whole and streamed, tool calls among them) once, one
at a time; its greedy answer is what the same request must answer under load. A valid request that
gets a 4xx here is left out of the load and listed (a template without tools, no speculator).
Then the load: each client, until the time is up, picks one action at a time (ACTIONS, seeded per
client): a valid greedy request read whole or streamed, or read by a slow reader, or sampled; a new
conversation (the prompt cache fills and evicts); a hang-up early (queued or in prefill), at the
first prefill progress event of a long prompt, in the middle of a stream, or while the request waits
behind a long stream of the same client; a hostile body
(soak_cases.hostile_cases). Every request has a deadline. Then the server is let settle and asked one
valid request more.

Checks (exit status 1 when one fails): no 5xx but 503 with Retry-After; no request past its deadline;
no connection dropped by the server; valid requests answered 200 with a complete stream, hostile
ones refused where they must be; every valid greedy answer equal to the quiet run's; streamed and
whole answers of the quiet run equal (text-only replies); no traceback in the server's log; the
server alive and answering after the load; resident memory after the load within 10% of
(after warm-up + --cache-memory). Warm-up: the quiet run and min(60 s, a quarter of the load).

Written as it goes (atomically: temporary file + os.replace): <name>.json (settings, counts by
status and action, latency percentiles, memory samples, checks, failures) and <name>.md every few
seconds, <name>_requests.jsonl (one line per request), <name>_memory.png (resident memory over time).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from .machine import describe_machine
from .soak_cases import (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    Case,
    hostile_cases,
    long_stream,
    new_conversation,
    valid_cases,
)
from .soak_checks import checks, judge, memory_summary
from .soak_client import Outcome, exchange
from .soak_report import summarize, write_report
from .soak_server import SoakServer

# what a client does next, and how often (weights)
ACTIONS = {
    "greedy": 30,  # a valid greedy request, whole or streamed: its answer must equal the quiet run's
    "slow-reader": 8,  # the same, read a line at a time with pauses, through a small receive buffer
    "sampled": 5,  # a valid request at temperature 0.8 with a seed (status only)
    "new-conversation": 8,  # a conversation nobody sent before (status only)
    "hang-up-early": 8,  # hung up 0-0.5 s after sending: while queued or in prefill
    "hang-up-mid-prefill": 8,  # a long prompt hung up on at its first prefill progress event
    "hang-up-mid-stream": 8,  # a stream hung up on after two deltas
    "hang-up-queued": 4,  # a request hung up on while it waits behind a long stream of the same client
    "hostile": 25,
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SLOW_READ_S = 0.05
REFUSED_PAUSE_S = 2.0  # a client refused with 503 waits at most this long (Retry-After, capped)
WARMUP_S = 60.0


class Soak:
    """The run: the server, its cases, the quiet answers, every request's record, the memory samples."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None] = print):
        self.args, self.log = args, log
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.stem = self.out / args.name
        self.server: SoakServer | None = None
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.quiet: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.memory: list[tuple[float, float, str]] = []  # (seconds since start, resident MB, phase)
        self.phase = "start"
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}
        self.done = threading.Event()
        self.result: dict[str, Any] = {}
        self._jsonl = None
        self._last_png = 0.0
        self.alive_at_end: bool | None = None
        self.differ: list[str] = []  # streamed quiet answers unlike the same request's whole one

    # memory
    def sample_memory(self) -> None:
        import psutil

        process = psutil.Process(self.server.pid)
        while not self.done.is_set():
            try:
                rss = process.memory_info().rss / 2**20
            except psutil.Error:
                return
            with self.lock:
                self.memory.append((round(time.monotonic() - self.t0, 2), round(rss, 1), self.phase))
            self.done.wait(self.args.sample_seconds)

    def mark(self, phase: str) -> None:
        self.phase = phase
        self.marks[phase] = round(time.monotonic() - self.t0, 2)
        self.log(f"{self.marks[phase]:8.1f} s  {phase}")

    # requests
    def send(self, case: Case, **how: Any) -> Outcome:
        server = self.server
        return exchange(server.host, server.port, case, self.args.deadline, headers=server.headers, **how)

    def record(self, client: int, action: str, case: Case, got: Outcome, compare: bool) -> dict[str, Any]:
        outcome, failure = judge(case, got, self.quiet.get(case.name) if compare else None, self.args.deadline)
        row = {
            "t": round(time.monotonic() - self.t0, 3),
            "phase": self.phase,
            "client": client,
            "action": action,
            "case": case.name,
            "route": case.route,
            "stream": case.stream,
            "status": got.status,
            "outcome": outcome,
            "seconds": round(got.seconds, 4),
            "first_token_s": None if got.first_token_s is None else round(got.first_token_s, 4),
            "calls": got.calls,
            "retry_after": got.retry_after,
            "compared": compare and case.name in self.quiet and outcome in ("200", "mismatch"),
        }
        if failure:
            row["failure"] = failure
        with self.lock:
            self.records.append(row)
            if self._jsonl is not None:
                self._jsonl.write(json.dumps(row) + "\n")
                self._jsonl.flush()
        return row

    def run_quiet(self) -> None:
        """Every valid request once, one at a time: the answers the load must reproduce."""
        self.mark("quiet")
        for case in self.valid:
            got = self.send(case)
            status = got.error_status or got.status  # an error inside a stream stands for its status
            if status is not None and 400 <= status < 500:
                self.skipped[case.name] = f"{status}: {got.error}"
                continue
            if got.status == 200 and got.complete and got.answer:
                self.quiet[case.name] = got.answer
            self.record(-1, "quiet", case, got, compare=False)
        self.differ = [
            name
            for name, answer in self.quiet.items()
            if name.endswith("/stream")
            and (whole := self.quiet.get(name[: -len("stream")] + "whole")) is not None
            and "\n<call " not in answer + whole
            and answer != whole
        ]
        self.log(f"quiet run: {len(self.quiet)} answers, {len(self.skipped)} requests not served")
        for name, why in self.skipped.items():
            self.log(f"  not served, left out of the load: {name} ({why})")

    def client(self, index: int, until: float) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        actions, weights = list(ACTIONS), list(ACTIONS.values())
        served = [c for c in self.valid if c.name in self.quiet]
        streams = [c for c in served if c.stream] or served
        n = 0
        while time.monotonic() < until:
            n += 1
            action = rng.choices(actions, weights)[0]
            tag = f"{self.args.seed}-{index}-{n}"
            if action == "greedy":
                case = rng.choice(served)
                row = self.record(index, action, case, self.send(case), compare=True)
            elif action == "slow-reader":
                case = rng.choice(streams)
                row = self.record(index, action, case, self.send(case, slow_s=SLOW_READ_S), compare=True)
            elif action == "sampled":
                case = rng.choice(served).with_fields("sampled", temperature=0.8, seed=rng.randrange(2**31))
                row = self.record(index, action, case, self.send(case), compare=False)
            elif action == "new-conversation":
                case = new_conversation(self.medium, self.args.max_tokens, tag, rng.randint(1, 3))
                row = self.record(index, action, case, self.send(case), compare=False)
            elif action == "hang-up-early":
                case = rng.choice([c for c in served if not c.stream] or served)
                got = self.send(case, hang_up="early", after_s=rng.uniform(0.0, 0.5))
                row = self.record(index, action, case, got, compare=False)
            elif action == "hang-up-mid-prefill":
                case = long_stream(self.long, self.args.max_tokens, tag, rng.choice((CHAT, COMPLETIONS)))
                if rng.random() < 0.5:
                    case = case.with_fields("cache-off", prompt_cache="off")
                row = self.record(index, action, case, self.send(case, hang_up="mid-prefill"), compare=False)
            elif action == "hang-up-mid-stream":
                case = longer(rng.choice(streams), 4 * self.args.max_tokens)
                row = self.record(index, action, case, self.send(case, hang_up="mid-stream"), compare=False)
            elif action == "hang-up-queued":
                row = self.hang_up_queued(index, rng, streams, served)
            else:
                case = rng.choice(self.hostile)
                row = self.record(index, action, case, self.send(case), compare=False)
            if row["outcome"] == "503":
                time.sleep(min(REFUSED_PAUSE_S, float(row.get("retry_after") or 1)) * rng.random())

    def hang_up_queued(self, index: int, rng: random.Random, streams: list[Case], served: list[Case]) -> dict:
        """A long stream (it holds the device), then a request sent behind it and hung up on after
        0.6 s (the server has seen the hang-up while the request waited), then the stream hung up on."""
        held = longer(rng.choice(streams), max(256, 8 * self.args.max_tokens))
        release, got = threading.Event(), {}

        def hold() -> None:
            got["held"] = self.send(held, hang_up="mid-stream", deltas=2**31, release=release)

        holder = threading.Thread(target=hold, name=f"soak-client-{index}-held", daemon=True)
        holder.start()
        time.sleep(0.2)
        queued = rng.choice(served)
        row = self.record(index, "hang-up-queued", queued, self.send(queued, hang_up="early", after_s=0.6), False)
        release.set()
        holder.join(self.args.deadline + 5)
        self.record(index, "hang-up-queued", held, got.get("held") or Outcome(timed_out=True), compare=False)
        return row

    def run_load(self) -> None:
        self.mark("load")
        start = time.monotonic()
        until = start + self.args.minutes * 60
        self.marks["warm"] = round(start - self.t0 + min(WARMUP_S, self.args.minutes * 15), 2)
        threads = [
            threading.Thread(target=self.client, args=(i, until), name=f"soak-client-{i}", daemon=True)
            for i in range(self.args.clients)
        ]
        for t in threads:
            t.start()
        give_up = until + self.args.deadline + 30  # every client's last request has had its deadline
        while (alive := [t for t in threads if t.is_alive()]) and time.monotonic() < give_up:
            self.write(final=False)
            alive[0].join(timeout=max(0.1, min(self.args.report_seconds, give_up - time.monotonic())))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:  # not waited for: the report says so
            self.result["stuck_clients"] = stuck

    def settle(self) -> None:
        """Wait (at most a deadline) for the server to be idle, then one valid request more."""
        self.mark("settle")
        deadline = time.monotonic() + self.args.deadline
        while time.monotonic() < deadline:
            try:
                health = self.server.get("/health")
                if not health["busy"] and not health["waiting"]:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        time.sleep(min(2.0, 2 * self.args.sample_seconds))  # one memory sample or two at rest
        self.mark("after")
        first = next((c for c in self.valid if c.name in self.quiet), None)
        if first is not None:
            row = self.record(-1, "after", first, self.send(first), compare=True)
            self.result["after"] = row

    def write(self, final: bool) -> None:
        with self.lock:
            records, memory = list(self.records), list(self.memory)
        self.result.update(
            title=title(self.args, self.server.info),
            settings=settings_of(self.args),
            server=self.server.info,
            machine=self.machine,
            marks=dict(self.marks),
            quiet={"answers": len(self.quiet), "not_served": dict(self.skipped), "stream_differs": self.differ},
            responses_route=self.server.responses,
            tracebacks=self.server.scan_log(),
            summary=summarize(records),
            final=final,
        )
        self.result["memory"] = memory_summary(memory, self.marks, self.args.cache_memory)
        if final and self.alive_at_end is None:  # asked once, before a server the soak started stops
            self.alive_at_end = self.server.alive()
        alive = self.alive_at_end if final else None
        self.result["checks"] = checks(self.result, records, alive)
        self.result["passed"] = all(c["ok"] is not False for c in self.result["checks"].values())
        now = time.monotonic()
        png = final or now - self._last_png >= 60
        if png:
            self._last_png = now
        write_report(self.result, memory, self.stem, png=png)

    def run(self) -> dict[str, Any]:
        self.machine = describe_machine({"threads": self.args.threads})
        self.server = SoakServer(self.args, self.stem)
        try:
            self._jsonl = open(self.stem.with_name(f"{self.args.name}_requests.jsonl"), "w")
            sampler = None
            if self.server.pid is not None:
                sampler = threading.Thread(target=self.sample_memory, name="soak-memory", daemon=True)
                sampler.start()
            self.medium, self.long = (
                self.server.text_of(min(250, self.server.context // 8)),
                self.server.text_of(min(1100, self.server.context // 3)),
            )
            self.valid = valid_cases(self.args.max_tokens, self.medium, self.long, self.server.responses)
            self.hostile = hostile_cases(self.server.responses)
            self.run_quiet()
            self.write(final=False)
            if self.quiet:
                self.run_load()
                self.settle()
            self.mark("end")
            self.done.set()
            if sampler is not None:
                sampler.join(timeout=10)
            self.write(final=True)
        finally:
            self.done.set()
            if self._jsonl is not None:
                self._jsonl.close()
            self.server.stop()
        if self.server.process is not None:  # the log is complete once the server stopped
            self.write(final=True)
        return self.result


def longer(case: Case, tokens: int) -> Case:
    """The same request with room for `tokens` tokens."""
    field = "max_output_tokens" if case.route == RESPONSES else "max_tokens"
    return case.with_fields("longer", **{field: tokens})


def title(args: argparse.Namespace, server: dict[str, Any]) -> str:
    return (
        f"Soak: {args.clients} clients, {args.minutes:g} min on {server['model']} "
        f"({args.dtype}, {server.get('backend')} {server.get('device')}, {args.threads} threads)"
    )


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("url", "model", "dtype", "threads", "clients", "minutes", "max_tokens", "deadline", "max_queue")
    return {k: getattr(args, k) for k in (*keys, "cache_memory", "speculator", "chat_template", "seed", "serve_args")}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specfill.evaluation.soak", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="a running server on a loopback address (default: start one)")
    p.add_argument("--log", default=None, help="with --url: the server's log, checked for tracebacks")
    p.add_argument("--api-key", default=os.environ.get("SPECFILL_API_KEY"), help="the server's key, if it has one")
    p.add_argument("--model", default=None, help="what `specfill serve --model` takes (default: the demo model)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--threads", type=int, default=2, help="the server's --threads (default: %(default)s)")
    p.add_argument(
        "--chat-template",
        default="tools",
        help="tools (the soak's ChatML template with tools), own (the model's), or a Jinja file (default: %(default)s)",
    )
    p.add_argument("--speculator", default="self:8", help="the server's --speculator (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=None, help="the server's --max-queue (default: half the clients)")
    p.add_argument(
        "--cache-memory",
        type=float,
        default=1.0,
        help="the server's --cache-memory in GB, the memory check's allowance (default: %(default)s)",
    )
    p.add_argument("--clients", type=int, default=8, help="concurrent clients, 1-64 (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=10.0, help="the load's length, up to 240 (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens per valid reply (default: %(default)s)")
    p.add_argument("--deadline", type=float, default=120.0, help="seconds a request may take (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the clients' choices (default: %(default)s)")
    p.add_argument("--sample-seconds", type=float, default=1.0, help="memory sampling period (default: %(default)s)")
    p.add_argument("--report-seconds", type=float, default=10.0, help="how often results are written (%(default)s)")
    p.add_argument("--out", default="results/soak", help="folder for the results (default: %(default)s)")
    p.add_argument("--name", default="soak", help="file name stem (default: %(default)s)")
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="further `specfill serve` flags (last)")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 1 <= args.clients <= 64:
        p.error(f"--clients must be 1-64, got {args.clients}")
    if not 0 < args.minutes <= 240:
        p.error(f"--minutes must be in (0, 240], got {args.minutes}")
    for flag, value in (("--threads", args.threads), ("--max-tokens", args.max_tokens)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    for flag, value in (
        ("--deadline", args.deadline),
        ("--sample-seconds", args.sample_seconds),
        ("--report-seconds", args.report_seconds),
        ("--cache-memory", args.cache_memory),
    ):
        if not 0 < value < float("inf"):
            p.error(f"{flag} must be a positive number, got {value}")
    if args.max_queue is None:
        args.max_queue = max(1, args.clients // 2)
    elif args.max_queue < 1:
        p.error(f"--max-queue must be >= 1, got {args.max_queue}")
    if args.url is not None:
        parts = urllib.parse.urlsplit(args.url)
        if parts.scheme != "http" or parts.hostname not in LOOPBACK:
            p.error(f"--url must be http:// on a loopback address (127.0.0.1, localhost, [::1]), got {args.url!r}")
        if args.model is not None or args.serve_args:
            p.error("--model and --serve-args start a server: give them or --url, not both")
    elif args.log is not None:
        p.error("--log names a running server's log: it goes with --url")
    if args.chat_template not in ("tools", "own") and not Path(args.chat_template).is_file():
        p.error(f"--chat-template must be tools, own or a Jinja file, got {args.chat_template!r}")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    result = Soak(args).run()
    failed = [name for name, check in result["checks"].items() if check["ok"] is False]
    print(f"soak {'FAILED: ' + ', '.join(failed) if failed else 'passed'}: {Path(args.out) / args.name}.md")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
