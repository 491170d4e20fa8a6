"""`specfill serve` on the Qwen2.5-Coder 1.5B + 0.5B Q4_K_M pair (issue 25): a client leaving during a
4K prefill (time to idle, progress events per method), 16 concurrent streams (answered, or 503 with
Retry-After, none lost), turn-2 TTFT with the prompt cache, RSS over sequential requests.

One real server (subprocess, 127.0.0.1, torch on CPU, float32), the official openai client and
plain HTTP for the disconnects. Writes serve_pair.json / serve_pair.md to --out.

    flock /work/model.lock python research/serve/bench_serve_pair.py --threads 2 --out results/serve
"""
from __future__ import annotations

import argparse, http.client, json, os, tempfile, threading, time  # noqa: E401
from pathlib import Path
from typing import Any

import openai

from specfill.evaluation.machine import describe_machine, machine_line
from specfill.evaluation.serve_process import ServerProcess, client
from specfill.evaluation.texts import eval_text

from server_state import rss_kb, wait_rebuilt  # research/serve/server_state.py (this folder is sys.path[0])

MODELS = Path.home() / ".cache" / "specfill" / "models"
MAIN, SPEC = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
METHODS = {"full": {}, "h2o": {"h2o_chunk_size": 512, "h2o_batch_size": 1024}, "specprefill": {"keep_ratio": 0.1}}


def text_of(server: ServerProcess, n_tokens: int, offset: int = 0) -> str:
    """About n_tokens tokens of the evaluation text (counted by the server's /tokenize)."""
    words = eval_text().split()[offset:]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/tokenize", body=json.dumps({"content": " ".join(words[:int(n_tokens * 0.8)])}),
                       headers={"Content-Type": "application/json"})
    count = json.loads(connection.getresponse().read())["count"]
    return " ".join(words[:int(len(words[:int(n_tokens * 0.8)]) * n_tokens / count)])


def disconnect(server: ServerProcess, prompt: str, method: str, events_before: int) -> dict[str, Any]:
    """Stream with progress events, hang up half a (mean) step after the `events_before`-th, inside
    the next step, and time how long the server stays busy afterwards."""
    body = {"prompt": prompt, "max_tokens": 8, "stream": True, "return_progress": True, "method": method,
            "prompt_cache": "off", **METHODS[method]}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response, seen, started = connection.getresponse(), [], time.perf_counter()
    while len(seen) < events_before:
        line = response.readline().decode()
        if not line:
            break
        if "prompt_progress" in line:
            seen.append(json.loads(line[len("data: "):])["prompt_progress"]["processed"])
    time.sleep((time.perf_counter() - started) / max(len(seen), 1) / 2)
    connection.close()
    gone = time.perf_counter()
    while server.health()["busy"]:
        time.sleep(0.02)
    return {"method": method, "events_before_disconnect": seen, "seconds_streamed": round(gone - started, 2),
            "hang_up": "half a step after the last event",
            "disconnect_to_idle_s": round(time.perf_counter() - gone, 2)}


def progress_events(server: ServerProcess, prompt: str, method: str) -> dict[str, Any]:
    """A whole prefill with progress events: how many, and the processed counts."""
    body = {"prompt": prompt, "max_tokens": 1, "stream": True, "return_progress": True, "method": method,
            "prompt_cache": "off", **METHODS[method]}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    processed, stages, stats = [], {}, {}
    for raw in connection.getresponse():
        line = raw.decode().strip()
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: "):])
            if "prompt_progress" in chunk:
                processed.append(chunk["prompt_progress"]["processed"])
                stages[chunk["prompt_progress"]["stage"]] = stages.get(chunk["prompt_progress"]["stage"], 0) + 1
            stats = chunk.get("specfill", stats)
    connection.close()
    return {"method": method, "events": len(processed), "processed": processed, "events_by_stage": stages,
            **{k: stats.get(k) for k in ("ttft_s", "kept_tokens", "prompt_tokens")}}


def concurrency(server: ServerProcess, n: int) -> dict[str, Any]:
    """n chat streams at once: each answered, or refused with 503 and a Retry-After; none lost."""
    outcomes: list[Any] = [None] * n
    c = client(server, timeout=900)

    def ask(i: int) -> None:
        try:
            stream = c.chat.completions.create(model=server.model, max_tokens=8, stream=True,
                                               messages=[{"role": "user", "content": f"Count from {i} to {i + 5}."}],
                                               extra_body={"prompt_cache": "off"})
            outcomes[i] = ("ok", len("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)))
        except openai.APIStatusError as err:
            outcomes[i] = (err.status_code, err.response.headers.get("retry-after"))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answered = sum(1 for o in outcomes if o and o[0] == "ok" and o[1] > 0)
    refused = [o[1] for o in outcomes if o and o[0] == 503]
    return {"streams": n, "answered": answered, "refused_503": len(refused), "retry_after_s": refused,
            "lost": n - answered - sum(1 for r in refused if r is not None)}


def turn2_ttft(server: ServerProcess, history: str) -> dict[str, Any]:
    """Turn 2 of a conversation (server TTFT) from the prompt cache and cold (prompt_cache off)."""
    c = client(server, timeout=900)
    first = [{"role": "user", "content": history + "\n\nSummarise this text in one sentence."}]
    one = c.chat.completions.create(model=server.model, messages=first, max_tokens=16)
    wait_rebuilt(server, 600)
    second = first + [{"role": "assistant", "content": one.choices[0].message.content},
                      {"role": "user", "content": "Which license is it?"}]
    cached = c.chat.completions.create(model=server.model, messages=second, max_tokens=8).model_extra["specfill"]
    cold = c.chat.completions.create(model=server.model, messages=second, max_tokens=8,
                                     extra_body={"prompt_cache": "off"}).model_extra["specfill"]
    return {"prompt_tokens": cached["prompt_tokens"], "cached_tokens": cached["cached_tokens"],
            "ttft_cached_s": cached["ttft_s"], "ttft_cold_s": cold["ttft_s"],
            "speedup": round(cold["ttft_s"] / max(cached["ttft_s"], 1e-9), 1)}


def rss(server: ServerProcess, requests: int) -> dict[str, Any]:
    """RSS (MB) after each of `requests` short sequential requests, methods in turn, cache off."""
    c, sizes = client(server, timeout=600), []
    for i in range(requests):
        c.completions.create(model=server.model, prompt=f"def f{i}(x):", max_tokens=4,
                             extra_body={"method": ("full", "h2o", "specprefill")[i % 3], "prompt_cache": "off"})
        sizes.append(round(rss_kb(server) / 1024, 1))
    return {"requests": requests, "rss_mb_first": sizes[0], "rss_mb_10": sizes[min(9, requests - 1)],
            "rss_mb_last": sizes[-1], "growth_after_10_mb": round(sizes[-1] - sizes[min(9, requests - 1)], 1)}


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# specfill serve on the Qwen2.5-Coder 1.5B + 0.5B pair (issue 25)", "",
             f"Machine: {machine_line(report['machine'])}. Shared with other jobs: "
             f"load average {report['load_before']} before, {report['load_after']} after; not quiet-machine figures.",
             f"Server: torch backend on CPU, float32, --prefill-step-size {report['prefill_step_size']}, "
             f"--speculator 0.5B, {report['threads']} thread(s). Commands: " + "; ".join(
                 f"`{c}`" for c in sorted(set(report.get("command_by_part", {}).values()) or {report["command"]})), ""]
    if "cancel" in report:
        whole = {row["method"]: row for row in report.get("progress", [])}
        lines += [f"## A client leaving during a ~{report['prompt_tokens']}-token prefill", "",
                  "| method | progress events per whole prefill (by stage) | processed at each | TTFT (s) | "
                  "disconnect after events at (+ half a step) | seconds per step before it | disconnect to idle (s) | "
                  "measured at (load average) |", "|---|---|---|---|---|---|---|---|"]
        for gone in report["cancel"]:
            w = whole.get(gone["method"], {"events": "not run", "processed": "", "ttft_s": ""})
            per_step = round(gone["seconds_streamed"] / (len(gone["events_before_disconnect"]) + 0.5 * ("hang_up" in gone)), 1)
            lines.append(f"| {gone['method']} | {w['events']} {w.get('events_by_stage', '')} | {w['processed']} | "
                         f"{w['ttft_s']} | {gone['events_before_disconnect']} | {per_step} | "
                         f"{gone['disconnect_to_idle_s']} | {gone.get('at', 'earlier run, old stepping')} ({gone.get('load', '?')}); "
                         f"{w.get('at', 'earlier run, old stepping')} ({w.get('load', '?')}) |")
        lines += ["", "The client hangs up inside a step (half a step after an event); the server notices at once "
                  "and stops before the next transformer layer (core/ops.py checkpoint: main model's and speculator's layers, "
                  f"H2O's chunks). Steps: {report['prefill_step_size']} tokens (H2O: whole chunks of {METHODS['h2o']}; "
                  "SpecPrefill: speculator, each look-ahead token, main prefill). Rows before 11:00 UTC on 25 Nov "
                  "(or 'old stepping') stopped at the end of the step (after the last event, no half-step wait).", ""]
    if "concurrency" in report:
        c = report["concurrency"]
        lines += [f"## {c['streams']} concurrent streams (queue of 8)", "",
                  f"answered {c['answered']}, refused 503 {c['refused_503']} (Retry-After {c['retry_after_s']} s), "
                  f"lost {c['lost']}", ""]
    if "ttft" in report:
        t = report["ttft"]
        lines += ["## Turn-2 TTFT with the prompt cache", "",
                  f"{t['prompt_tokens']} prompt tokens, {t['cached_tokens']} from the cache: TTFT {t['ttft_cached_s']} s "
                  f"cached vs {t['ttft_cold_s']} s cold ({t['speedup']}x)", ""]
    if "rss" in report:
        r = report["rss"]
        lines += [f"## RSS over {r['requests']} sequential requests", "",
                  f"{r['rss_mb_first']} MB after request 1, {r['rss_mb_10']} after 10, {r['rss_mb_last']} after "
                  f"{r['requests']} (growth after 10: {r['growth_after_10_mb']} MB)", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="cancel,progress,concurrency,ttft,rss")
    p.add_argument("--markdown-only", action="store_true", help="rewrite serve_pair.md from serve_pair.json")
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--prefill-step-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--whole", default="full,h2o,specprefill", help="methods whose whole prefill is run (progress)")
    p.add_argument("--cancel", default="full,h2o,specprefill", help="methods whose prefill is left (cancel)")
    p.add_argument("--history-tokens", type=int, default=2000, help="turn-1 history for the turn-2 TTFT")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    parts, out = set(args.parts.split(",")), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.markdown_only:
        (out / "serve_pair.md").write_text(markdown(json.loads((out / "serve_pair.json").read_text())))
        return
    earlier = out / "serve_pair.json"  # parts left out keep their figures from an earlier run
    report: dict[str, Any] = json.loads(earlier.read_text()) if earlier.is_file() else {}
    report.update(load_before=round(os.getloadavg()[0], 2), threads=args.threads, prefill_step_size=args.prefill_step_size,
                  command=f"python research/serve/bench_serve_pair.py --parts {args.parts} --threads {args.threads} --prefill-step-size "
                          f"{args.prefill_step_size} --whole {args.whole} --cancel {args.cancel} --history-tokens {args.history_tokens} "
                          f"--requests {args.requests}")
    report.setdefault("command_by_part", {}).update({part: report["command"] for part in parts})
    server = ServerProcess("--model", str(MAIN), "--speculator", str(SPEC), "--dtype", "float32",
                           "--prefill-step-size", str(args.prefill_step_size), "--max-tokens", "16",
                           log=Path(tempfile.gettempdir()) / "specfill_serve_pair.log", threads=args.threads,
                           start_timeout=400)  # loading the pair takes 1-4 minutes on the loaded 2-core host
    try:
        prompt, report["prompt_tokens"] = text_of(server, args.prompt_tokens), args.prompt_tokens
        for key, measure, methods in (("cancel", lambda m: disconnect(server, prompt, m, 2), args.cancel),
                                      ("progress", lambda m: progress_events(server, prompt, m), args.whole)):
            for method in (m for m in methods.split(",") if m and key in parts):  # rows by method, merged
                rows = {row["method"]: row for row in report.get(key, [])}
                rows[method] = {**measure(method), "load": round(os.getloadavg()[0], 2), "at": time.strftime("%H:%M UTC", time.gmtime())}
                report[key] = [rows[m] for m in METHODS if m in rows]
                save(report, out)
        if "concurrency" in parts:
            report["concurrency"] = concurrency(server, 16)
            save(report, out)
        if "ttft" in parts:
            report["ttft"] = turn2_ttft(server, text_of(server, args.history_tokens, offset=3000))
            save(report, out)
        if "rss" in parts:
            report["rss"] = rss(server, args.requests)
            report.pop("rss_note", None)
            save(report, out)
    finally:
        server.stop()
    print(markdown(report))


def save(report: dict[str, Any], out: Path) -> None:
    """Write what is measured so far (a run cut short keeps its finished parts)."""
    report.update(load_after=round(os.getloadavg()[0], 2), machine=describe_machine())
    (out / "serve_pair.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "serve_pair.md").write_text(markdown(report))
    if "cancel" in report:
        plot_cancel(report, out / "serve_pair_cancel.png")
    print(markdown(report), flush=True)


def plot_cancel(report: dict[str, Any], path: Path) -> None:
    """Bars: seconds from disconnect to idle per method, labelled with the progress events per prefill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods, (fig, ax) = [row["method"] for row in report["cancel"]], plt.subplots(figsize=(6, 3.5))
    bars = ax.bar(methods, [row["disconnect_to_idle_s"] for row in report["cancel"]], color="#4477aa")
    events = {row["method"]: row["events"] for row in report.get("progress", [])}
    for bar, method in zip(bars, methods):
        label = f"{events[method]} progress events" if method in events else ""
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("disconnect to idle (s)")
    ax.set_title(f"specfill serve, ~{report['prompt_tokens']}-token prefill: Qwen2.5-Coder 1.5B + 0.5B Q4_K_M, float32, CPU (torch), "
                 f"{report['threads']} threads, step {report['prefill_step_size']}", fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main()
