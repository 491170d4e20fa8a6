"""`specfill serve` on the demo model: turn-2 TTFT with the prompt cache vs without, multi-turn
exactness after a SpecPrefill turn, and the server's RSS over 50 sequential requests.

One real server (subprocess, 127.0.0.1), the official openai client, greedy decoding. Turn 1 is a
pasted text with numbered lines plus a question; turn 2 asks to quote one line. TTFT is the
server's (from the start of the generation to the first token; `specfill.ttft_s`) and the client's
(request sent to first streamed text). Each conversation starts with its own document title, so
no scenario reuses another's cache.

    python research/serve/bench_serve.py                       # 4K history, 3K exactness, 50 requests
    python research/serve/bench_serve.py --history 2000 --threads 2 --out results/serve
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from specfill.core.io.demo_model import require_demo_model
from specfill.core.io.tokenizer import load_tokenizer
from specfill.evaluation.machine import describe_machine, machine_line
from specfill.evaluation.serve_process import ServerProcess, client
from specfill.evaluation.texts import eval_text

import server_state  # research/serve/server_state.py (this folder is sys.path[0])


def numbered_text(tokenizer: Any, n_tokens: int, title: str) -> tuple[str, dict[int, str]]:
    """Lines of the evaluation text as "Line N: ...", about n_tokens tokens in all."""
    lines, out, used = [line.strip() for line in eval_text().splitlines() if line.strip()], [], 0
    numbered = {}
    for i, line in enumerate(lines, 1):
        row = f"Line {i}: {line}"
        used += len(tokenizer.encode(row + "\n", add_special_tokens=False))
        if used > n_tokens:
            break
        out.append(row)
        numbered[i] = line
    return f"Document: {title}\n\n" + "\n".join(out), numbered


def turn(c: Any, messages: list[dict], **fields: Any) -> dict[str, Any]:
    """One streamed chat turn: reply, server statistics, client-side time to first text."""
    sent, first, pieces, stats = time.perf_counter(), None, [], {}
    for chunk in c.chat.completions.create(model="demo", messages=messages, max_tokens=32, temperature=0,
                                           stream=True, extra_body=fields):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            pieces.append(chunk.choices[0].delta.content)
        stats = (chunk.model_extra or {}).get("specfill", stats)
    return {"reply": "".join(pieces), "client_ttft_s": round((first or time.perf_counter()) - sent, 4), **stats}


def wait_rebuilt(server: ServerProcess) -> float:
    started = time.perf_counter()
    server_state.wait_rebuilt(server, 3600)
    return round(time.perf_counter() - started, 3)


def conversation(server: ServerProcess, tokenizer: Any, history: int, title: str, *, first: dict, second: dict,
                 wait: bool) -> dict[str, Any]:
    """Turn 1 with `first` fields, optionally waiting for the idle rebuild, then turn 2 (quote the
    middle line) with `second`."""
    c = client(server, timeout=1800)
    text, lines = numbered_text(tokenizer, history, title)
    quote = len(lines) // 2
    user1 = {"role": "user", "content": f"{text}\n\nWhat is this document about? Answer briefly."}
    one = turn(c, [user1], **first)
    rebuild = wait_rebuilt(server) if wait else None
    two_turns = [user1, {"role": "assistant", "content": one["reply"]},
                 {"role": "user", "content": f"Quote line {quote} of the document verbatim."}]
    two = turn(c, two_turns, **second)
    return {"turn1": one, "rebuild_wait_s": rebuild, "turn2": two, "messages": two_turns,
            "quoted_line": f"Line {quote}: {lines[quote]}"}


def ttft_scenarios(server: ServerProcess, tokenizer: Any, history: int) -> dict[str, Any]:
    spec = {"method": "specprefill", "keep_ratio": 0.1}
    runs = {
        "no cache (full prefill of both turns)": dict(first={"prompt_cache": "off"}, second={"prompt_cache": "off"},
                                                      wait=False),
        "exact cache, turn 1 full": dict(first={}, second={}, wait=True),
        "exact cache, turn 1 SpecPrefill, rebuilt in idle time": dict(first=spec, second=spec, wait=True),
        "exact cache, turn 1 SpecPrefill, turn 2 at once (what the rebuild has not done, turn 2 prefills)": dict(
            first=spec, second=spec, wait=False),
        "approximate cache, turn 1 SpecPrefill": dict(first={**spec, "prompt_cache": "approximate"},
                                                       second={"prompt_cache": "approximate"}, wait=False),
    }
    out = {}
    for i, (name, run) in enumerate(runs.items()):
        result = conversation(server, tokenizer, history, f"report {i}", **run)
        result.pop("messages"), result.pop("quoted_line")
        out[name] = result
        print(f"{name}: turn-2 TTFT {result['turn2']['ttft_s']:.3f} s (cached {result['turn2']['cached_tokens']})",
              flush=True)
    return out


def exactness(server: ServerProcess, tokenizer: Any, history: int) -> dict[str, Any]:
    """Turn 1 SpecPrefill keep 0.1 (exact cache, rebuilt), turn 2 vs a dense run of both turns,
    and the approximate policy's turn 2 beside them."""
    cached = conversation(server, tokenizer, history, "exactness", first={"method": "specprefill", "keep_ratio": 0.1},
                          second={}, wait=True)
    c = client(server, timeout=1800)
    dense = turn(c, cached["messages"], prompt_cache="off")
    approx = conversation(server, tokenizer, history, "exactness", wait=False,
                          first={"method": "specprefill", "keep_ratio": 0.1, "prompt_cache": "approximate"},
                          second={"prompt_cache": "approximate"})
    return {"history_tokens": cached["turn1"]["prompt_tokens"], "turn1_kept_tokens": cached["turn1"]["kept_tokens"],
            "quoted_line": cached["quoted_line"], "turn2_cached": cached["turn2"]["reply"],
            "turn2_cached_tokens": cached["turn2"]["cached_tokens"], "turn2_dense": dense["reply"],
            "equal": cached["turn2"]["reply"] == dense["reply"], "turn2_approximate": approx["turn2"]["reply"],
            "approximate_equals_dense": approx["turn2"]["reply"] == dense["reply"]}


def rss_run(server: ServerProcess, requests: int) -> dict[str, Any]:
    c = client(server, timeout=600)
    sizes = []
    for i in range(requests):
        messages = [{"role": "user", "content": f"Request {i}: name a colour and a number."}]
        c.chat.completions.create(model=server.model, messages=messages, max_tokens=16,  # a leak check: no cache growth
                                  extra_body={"method": ("full", "h2o", "specprefill")[i % 3], "prompt_cache": "off"})
        sizes.append(server_state.rss_kb(server))
    return {"requests": requests, "rss_mb": [round(s / 1024, 1) for s in sizes],
            "growth_after_10_mb": round((sizes[-1] - sizes[min(9, requests - 1)]) / 1024, 1)}


def markdown(report: dict[str, Any]) -> str:
    ttft = report["turn2_ttft"]
    base = ttft["no cache (full prefill of both turns)"]["turn2"]["ttft_s"]
    rows = ["| scenario | turn-1 TTFT (s) | turn-1 kept | idle rebuild wait (s) | turn-2 cached tokens | "
            "turn-2 prompt tokens | turn-2 TTFT server (s) | turn-2 queue (s) | client (s) | "
            "speed-up vs no cache (server) |",
            "|---" * 10 + "|"]
    for name, r in ttft.items():
        one, two = r["turn1"], r["turn2"]
        rows.append(f"| {name} | {one['ttft_s']:.3f} | {one['kept_tokens']}/{one['prompt_tokens']} | "
                    f"{'' if r['rebuild_wait_s'] is None else r['rebuild_wait_s']} | {two['cached_tokens']} | "
                    f"{two['prompt_tokens']} | {two['ttft_s']:.3f} | {two['queue_s']:.3f} | "
                    f"{two['client_ttft_s']:.3f} | "
                    f"{base / max(two['ttft_s'], 1e-9):.1f}x |")
    ex, rss = report["exactness"], report["rss"]
    return "\n".join([
        f"# specfill serve: prompt cache and soak ({report['model']}, {report['dtype']}, {report['device']}, "
        f"{report['threads']} thread(s))", "", f"Machine: {machine_line(report['machine'])}", "",
        *[f"Command ({part}): `{command}`" for part, command in report["command_by_part"].items()], "",
        f"## Turn-2 TTFT with the prompt cache vs without (~{report['history']} tokens of history)", "", *rows, "",
        "Idle rebuild wait: time from the end of turn 1 until the dense KV of the SpecPrefill turn was rebuilt "
        "(the client sent turn 2 after it). Server TTFT runs from the start of the generation; queue is the wait "
        "before it (an idle rebuild step in progress); client is what the user sees (request to first text). "
        "Goal of issue #16: >= 5x at 4K of history.", "",
        f"## Multi-turn exactness (~{ex['history_tokens']} tokens, turn 1 SpecPrefill keep 0.1, greedy)", "",
        f"- turn 1 kept {ex['turn1_kept_tokens']}/{ex['history_tokens']} tokens; turn 2 reused "
        f"{ex['turn2_cached_tokens']} cached tokens (dense, rebuilt in idle time)",
        f"- turn 2 with the exact cache == dense run of both turns: **{ex['equal']}**",
        f"- the line asked for: `{ex['quoted_line']}`",
        f"- turn 2, exact cache: `{ex['turn2_cached']}`", f"- turn 2, dense run: `{ex['turn2_dense']}`",
        f"- turn 2, approximate cache (SpecPrefill KV reused as is): `{ex['turn2_approximate']}` "
        f"(equals dense: {ex['approximate_equals_dense']})", "",
        f"## RSS over {rss['requests']} sequential requests (chat, 16 tokens, methods full/h2o/specprefill in turn, "
        "prompt cache off for them: a leak check)", "",
        f"RSS after request 1 / 10 / {rss['requests']}: {rss['rss_mb'][0]} / "
        f"{rss['rss_mb'][min(9, len(rss['rss_mb']) - 1)]}"
        f" / {rss['rss_mb'][-1]} MB; growth after request 10: {rss['growth_after_10_mb']} MB. With the prompt cache "
        "on, RSS also holds the cached conversations, up to `--cache-tokens`.", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, default=4000, help="turn-1 text tokens for the TTFT scenarios")
    p.add_argument("--exact-history", type=int, default=3000, help="turn-1 text tokens for the exactness run")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--parts", default="ttft,exactness,rss",
                   help="comma list; parts left out keep their figures from an earlier serve_bench.json in --out")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(require_demo_model())
    server = ServerProcess("--speculator", "self:8", "--max-tokens", "32", "--dtype", "float32",
                           "--served-model-name", "demo",
                           log=Path(tempfile.gettempdir()) / "specfill_serve_bench.log", threads=args.threads)
    earlier = out / "serve_bench.json"
    report = json.loads(earlier.read_text()) if earlier.is_file() and parts != {"ttft", "exactness", "rss"} else {}
    try:
        command = (f"python research/serve/bench_serve.py --history {args.history} --exact-history {args.exact_history} "
                   f"--requests {args.requests} --threads {args.threads} --parts {args.parts}")
        report.update({"model": "SmolLM2-135M-Instruct Q4_1 (demo)", "dtype": "float32", "device": "cpu (torch)",
                       "threads": args.threads, "history": args.history})
        report.setdefault("command_by_part", {}).update({part: command for part in parts})
        if "ttft" in parts:
            report["turn2_ttft"] = ttft_scenarios(server, tokenizer, args.history)
        if "exactness" in parts:
            report["exactness"] = exactness(server, tokenizer, args.exact_history)
            print(f"exactness: {report['exactness']['equal']}", flush=True)
        if "rss" in parts:
            report["rss"] = rss_run(server, args.requests)
            print(f"rss: {report['rss']['rss_mb'][0]} -> {report['rss']['rss_mb'][-1]} MB", flush=True)
        report.setdefault("machine_by_part", {}).update(
            {part: describe_machine({"torch_threads": args.threads}) for part in parts})
        report["machine"] = describe_machine({"torch_threads": args.threads})
    finally:
        server.stop()
    (out / "serve_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "serve_bench.md").write_text(markdown(report))
    print(f"wrote {out / 'serve_bench.md'}")


if __name__ == "__main__":
    main()
