"""The soak's verdicts (evaluation/soak.py): each request's outcome, and the checks over a whole run."""

from __future__ import annotations

from typing import Any

from .soak_cases import Case
from .soak_client import Outcome

MEMORY_SLACK = 0.10  # resident memory after the load may exceed (after warm-up + --cache-memory) by this share


def judge(case: Case, got: Outcome, quiet: str | None, deadline: float) -> tuple[str, str | None]:
    """(outcome, failure or None) of one request: its status (or hang / dropped / hung up / mismatch)."""
    if got.hung_up:
        return f"hung up {got.hung_up}", None
    if got.timed_out:
        return "hang", f"no complete answer within the {deadline:g} s deadline"
    if got.status is None:
        return "dropped", f"the connection failed: {got.error}"
    status = got.error_status or got.status  # an error inside a 200 stream stands for its status
    if status >= 500:
        if status == 503 and (got.retry_after or "").isdigit() and int(got.retry_after) > 0:
            return "503", None
        return str(status), f"{status} ({'no Retry-After: ' if status == 503 else ''}{got.error})"
    if case.expect == "4xx":
        return str(status), None if 400 <= status < 500 else f"a hostile request was answered {status}"
    if case.expect == "any":
        return str(status), None
    if status != 200:
        return str(status), f"a valid request was refused: {got.error}"
    if not got.complete:
        return "truncated", f"the {'stream' if case.stream else 'body'} ended early ({got.error})"
    if quiet is not None and got.answer != quiet:
        return "mismatch", f"answer {_clip(got.answer)} differs from the quiet run's {_clip(quiet)}"
    return "200", None


def checks(result: dict[str, Any], records: list[dict[str, Any]], alive: bool | None) -> dict[str, dict[str, Any]]:
    """Each check: ok (True, False, or None: not run or not yet) and a line saying what it found."""

    def first(rows: list[dict[str, Any]]) -> str:
        return f"; first: {rows[0]['case']} ({rows[0]['action']}): {rows[0]['failure']}" if rows else ""

    failed = [r for r in records if "failure" in r]
    server = [r for r in failed if r["outcome"][:1] == "5"]
    hangs = [r for r in failed if r["outcome"] == "hang"]
    dropped = [r for r in failed if r["outcome"] == "dropped"]
    statuses = [r for r in failed if r["outcome"] == "truncated" or r["outcome"][:1] in "1234"]
    mismatches = [r for r in failed if r["outcome"] == "mismatch"]
    compared = sum(r["compared"] for r in records)
    quiet, stuck = result["quiet"], result.get("stuck_clients", [])
    quiet_failed = [r for r in failed if r["phase"] == "quiet"]
    out = {
        "quiet run": (
            bool(quiet["answers"]) and not quiet_failed,
            f"{quiet['answers']} answers, {len(quiet['not_served'])} valid requests refused (4xx)"
            + first(quiet_failed),
        ),
        "no 5xx but 503 with Retry-After": (not server, f"{len(server)} responses{first(server)}"),
        "no hang": (
            not hangs and not stuck,
            f"{len(hangs)} requests past the deadline" + (f", clients stuck: {stuck}" if stuck else "") + first(hangs),
        ),
        "no dropped connection": (not dropped, f"{len(dropped)} requests{first(dropped)}"),
        "statuses as expected": (not statuses, f"{len(statuses)} requests{first(statuses)}"),
        "greedy answers equal the quiet run's": (
            compared > 0 and not mismatches,
            f"{compared} compared, {len(mismatches)} differ{first(mismatches)}",
        ),
        "streamed answers equal whole ones": (not quiet["stream_differs"], f"differ: {quiet['stream_differs']}"),
    }
    tracebacks = result["tracebacks"]
    out["no traceback in the server log"] = (
        (None, "no server log to read (--log)")
        if tracebacks is None
        else (not tracebacks["count"], f"{tracebacks['count']} tracebacks: {tracebacks['errors']}")
    )
    after = result.get("after")
    out["serves after the load"] = (
        (None, "not yet")
        if alive is None
        else (
            alive and after is not None and after["outcome"] == "200",
            f"server alive: {alive}, one more request: {None if after is None else after['outcome']}",
        )
    )
    memory = result["memory"]
    if memory.get("final_mb") is None or alive is None:
        out["resident memory held"] = (None, memory.get("note", "not yet"))
    else:
        out["resident memory held"] = (
            memory["final_mb"] <= memory["allowed_mb"],
            f"{memory['final_mb']} MB after the load, {memory['warm_mb']} MB after warm-up, "
            f"allowed {memory['allowed_mb']} MB (+{MEMORY_SLACK:.0%} of warm-up + --cache-memory)",
        )
    return {name: {"ok": None if ok is None else bool(ok), "detail": detail} for name, (ok, detail) in out.items()}


def memory_summary(memory: list[tuple[float, float, str]], marks: dict[str, float], cache_gb: float) -> dict[str, Any]:
    """Resident MB at the start, after warm-up, after the load (at rest, before the last request), at most."""
    if not memory:
        return {"note": "no memory samples (the server's process was not found)"}
    rss = [m[1] for m in memory]
    warm = next((m[1] for m in memory if "warm" in marks and m[0] >= marks["warm"]), None)
    rest = [m[1] for m in memory if m[2] == "settle"]
    summary = {"samples": len(memory), "start_mb": rss[0], "max_mb": max(rss), "warm_mb": warm}
    summary["final_mb"] = rest[-1] if rest and warm is not None else None
    if warm is not None:
        summary["allowed_mb"] = round((1 + MEMORY_SLACK) * (warm + cache_gb * 1024), 1)
    return summary


def _clip(text: str | None, size: int = 80) -> str:
    text = text or ""
    return repr(text if len(text) <= size else text[:size] + "...")
