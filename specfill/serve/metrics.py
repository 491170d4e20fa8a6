"""The server's log line per request and its Prometheus metrics (GET /metrics).

Every request ends in exactly one Outcome, recorded on the event loop (no lock needed): it is
logged as one line (`specfill.serve` logger, INFO; timestamps from the log format) and counted.
Metric names follow vLLM's and llama.cpp's conventions, with the `specfill_` prefix.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("specfill.serve")

# seconds; TTFT of a short prompt on a GPU to a 32K prompt on a CPU
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0)


@dataclass
class Outcome:
    """How one request ended. outcome: "ok", "cancelled", or the HTTP status of an error ("400", "503")."""

    request_id: str
    route: str  # "chat", "completion", "messages"
    outcome: str
    reason: str = ""  # the error message, for errors
    stats: dict[str, Any] = field(default_factory=dict)  # the response's `specfill` statistics, when it ran

    def line(self) -> str:
        """The log line: id, route, methods asked -> run, tokens, TTFT, speed, outcome."""
        s = self.stats
        parts = [f"{self.request_id} {self.route}"]
        if s:
            parts.append(
                f"method={s.get('method')}->{s.get('prefill_method')} prompt={s.get('prompt_tokens')} "
                f"cached={s.get('cached_tokens')} kept={s.get('kept_tokens')} "
                f"ttft={s.get('ttft_s', 0.0):.3f}s gen={s.get('generation_tokens')} "
                f"tok/s={s.get('generation_tps', 0.0):.1f} queue={s.get('queue_s', 0.0):.3f}s"
            )
        parts.append(f"outcome={self.outcome}" + (f" ({self.reason})" if self.reason else ""))
        return " ".join(parts)


class Histogram:
    """Cumulative-bucket histogram per label value (Prometheus' `_bucket`, `_sum`, `_count`)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.sums: defaultdict[str, float] = defaultdict(float)

    def observe(self, label: str, value: float) -> None:
        slot = next((i for i, edge in enumerate(BUCKETS) if value <= edge), len(BUCKETS))
        self.counts[label][slot] += 1
        self.sums[label] += value

    def lines(self, name: str, label: str) -> list[str]:
        out = []
        for value, counts in sorted(self.counts.items()):
            running = 0
            for edge, count in zip((*BUCKETS, math.inf), counts):
                running += count
                le = "+Inf" if edge == math.inf else repr(edge)
                out.append(f'{name}_bucket{{{label}="{value}",le="{le}"}} {running}')
            out.append(f'{name}_sum{{{label}="{value}"}} {self.sums[value]:.6f}')
            out.append(f'{name}_count{{{label}="{value}"}} {running}')
        return out


class Metrics:
    """Counters and histograms over every request the server answered."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.tokens = Counter({"prompt": 0, "cached": 0, "generated": 0})
        self.cache_hits = 0
        self.ttft = Histogram()
        self.prefill = Histogram()

    def record(self, outcome: Outcome) -> None:
        """Count one finished request and log its line."""
        self.outcomes[outcome.outcome] += 1
        s = outcome.stats
        if s:
            method = str(s.get("prefill_method"))
            self.tokens["prompt"] += int(s.get("prompt_tokens") or 0)
            self.tokens["cached"] += int(s.get("cached_tokens") or 0)
            self.tokens["generated"] += int(s.get("generation_tokens") or 0)
            self.cache_hits += int(bool(s.get("cached_tokens")))
            self.ttft.observe(method, float(s.get("ttft_s") or 0.0))
            self.prefill.observe(method, float(sum((s.get("prefill_seconds") or {}).values())))
        level = logging.INFO if outcome.outcome in ("ok", "cancelled") else logging.WARNING
        log.log(level, outcome.line())

    def render(self, waiting: int, running: bool, cache: dict[str, Any] | None = None) -> str:
        """The Prometheus text exposition (format 0.0.4)."""
        out = [
            "# HELP specfill_requests_total Requests answered, by outcome (ok, cancelled, HTTP error status).",
            "# TYPE specfill_requests_total counter",
        ]
        out += [f'specfill_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(self.outcomes.items())]
        out += [
            "# HELP specfill_queue_depth Requests waiting for the device.",
            "# TYPE specfill_queue_depth gauge",
            f"specfill_queue_depth {waiting}",
            "# HELP specfill_requests_running Requests on the device (0 or 1).",
            "# TYPE specfill_requests_running gauge",
            f"specfill_requests_running {int(running)}",
        ]
        for kind, what in (
            ("prompt", "Prompt tokens of answered requests"),
            ("cached", "Prompt tokens taken from the prompt cache"),
            ("generated", "Tokens generated"),
        ):
            name = f"specfill_{kind}_tokens_total"
            out += [f"# HELP {name} {what}.", f"# TYPE {name} counter", f"{name} {self.tokens[kind]}"]
        out += [
            "# HELP specfill_prompt_cache_hits_total Requests that reused a cached conversation.",
            "# TYPE specfill_prompt_cache_hits_total counter",
            f"specfill_prompt_cache_hits_total {self.cache_hits}",
        ]
        for key, what in (
            ("entries", "Conversations whose KV the prompt cache holds in memory"),
            ("bytes", "Bytes of the prompt cache's KV in memory"),
            ("disk_entries", "Conversations in the prompt cache's disk store"),
            ("disk_bytes", "Bytes of the prompt cache's disk store"),
        ):
            if cache is not None and cache.get(key) is not None:
                name = f"specfill_prompt_cache_{key}"
                out += [f"# HELP {name} {what}.", f"# TYPE {name} gauge", f"{name} {cache[key]}"]
        for name, hist, what in (
            ("specfill_time_to_first_token_seconds", self.ttft, "Time to first token"),
            ("specfill_prefill_seconds", self.prefill, "Prefill time"),
        ):
            out += [f"# HELP {name} {what}, by the prefill method that ran.", f"# TYPE {name} histogram"]
            out += hist.lines(name, "method")
        return "\n".join(out) + "\n"


def configure_logging(level: str) -> None:
    """Timestamped lines on stderr for specfill's and uvicorn's loggers at `level` (--log-level)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    )
    for name in ("specfill.serve", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler] if name != "uvicorn.error" else []
        logger.setLevel(level.upper())
        logger.propagate = name == "uvicorn.error"
