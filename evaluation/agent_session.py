"""A scripted coding-agent session against `specfill serve` (issue 37 item 4): TTFT per turn with the
prompt cache, without it, and after a server restart that reads the cache back from disk.

    python -m specfill.evaluation.agent_session --model PATH_OR_SPEC [--dtype float32] [--threads 2]
        [--turns 10] [--tool-tokens 1000-4000] [--system-tokens 0] [--max-tokens 16] [--out results/agent_session]

The session, played with the official openai client: a coding agent's system prompt and tools
(read_file, list_files, search_code, edit_file, run_tests), a user task, then per turn one scripted
assistant call read_file(PATH) and its result: one of this package's own source files cut to the
turn's size (sizes spread over --tool-tokens, counted with the served model's tokenizer through
/tokenize), then the model's reply (--max-tokens, greedy). The calls are scripted rather than the
model's own so that every model plays the same session and the prompt is known before the reply.

Per turn, on one server with `--prompt-cache-dir`: the request as played (cached: the conversation
so far is reused) and the same prompt with the request field prompt_cache "off" (cold: a full
prefill that neither reads nor writes the cache), their server-side TTFT (`specfill.ttft_s`, the
prefill and first token without HTTP), cached_tokens, and whether the two replies are equal (text
and token count; float32 should make them so). Then the server is restarted on the same directory
and every turn's prompt is sent again, last turn first: that one reads the conversation from disk,
the earlier ones find its prefix in memory (in turn order, turn 1's prompt would be taken as an edit
of the kept conversation and cut it back: docs/serve.md "Prompt cache"). Each server answers one
short warm-up request (prompt cache off) before the first measured one. The results JSON is written
atomically after every turn and a rerun with the same --out and settings resumes after the last
turn written (the next turn's cache then comes from disk); the Markdown table and the PNG plot
(`<name>_ttft.png`) are written at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from .machine import describe_machine, machine_line
from .serve_process import ServerProcess, client

SYSTEM = (
    "You are a coding agent working in a Python repository. Use the tools to read and search the code "
    "before you answer; never guess a file's contents. Keep answers short and precise, name files and "
    "functions, and when you change code run the tests. Call one tool at a time and wait for its result."
)
TASK = (
    "Review how the server reuses KV caches between requests and look for bugs. Start by reading the "
    "relevant files one by one, then summarise what you found."
)


def _function(name: str, description: str, **properties: str) -> dict[str, Any]:
    props = {k: {"type": "string", "description": v} for k, v in properties.items()}
    schema = {"type": "object", "properties": props, "required": list(props)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


TOOLS = [
    _function("read_file", "Read a file of the repository", path="the file's path"),
    _function("list_files", "List the files under a folder", folder="the folder's path"),
    _function("search_code", "Search the repository for a regular expression", pattern="a Python regex"),
    _function("edit_file", "Replace text in a file", path="the file's path", old="the text", new="its replacement"),
    _function("run_tests", "Run pytest on some test files", paths="space-separated test paths"),
]


def source_files(min_chars: int) -> list[tuple[str, str]]:
    """(path shown to the model, text) of this package's Python files of at least min_chars, by path."""
    import specfill
    import specfill.core
    import specfill.serve

    roots = {Path(m.__file__).resolve().parent for m in (specfill, specfill.core, specfill.serve)}
    base = Path(specfill.__file__).resolve().parents[1]
    files = {p for root in roots for p in root.rglob("*.py")}
    out = []
    for path in sorted(files):
        text = path.read_text(encoding="utf-8")
        if len(text) >= min_chars:
            out.append((str(path.relative_to(base)) if path.is_relative_to(base) else path.name, text))
    if not out:
        raise RuntimeError(f"no source file of at least {min_chars} characters")
    return out


def tool_sizes(spec: str, turns: int) -> list[int]:
    """--tool-tokens 'N' or 'LO-HI': each turn's tool result size, spread over LO..HI in four steps."""
    lo, _, hi = spec.partition("-")
    low, high = int(lo), int(hi or lo)
    if not 0 < low <= high:
        raise ValueError(f"--tool-tokens must be N or LO-HI with 0 < LO <= HI, got {spec!r}")
    return [low + (high - low) * (i % 4) // 3 for i in range(turns)]


def _post(server: ServerProcess, route: str, body: dict[str, Any]) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(
        server.url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def cut_to_tokens(server: ServerProcess, text: str, tokens: int) -> tuple[str, int]:
    """The text's first `tokens` tokens (the served tokenizer), as text, and how many it has."""
    ids = _post(server, "/tokenize", {"content": text, "add_special": False})["tokens"][:tokens]
    return _post(server, "/detokenize", {"tokens": ids})["content"], len(ids)


def project_guide() -> str:
    """What an agent puts in its system prompt besides its rules: the project's own guide (this
    repository's docs/*.md, as Claude Code reads CLAUDE.md), or its sources where no docs ship."""
    import specfill

    docs = sorted(Path(specfill.__file__).resolve().parents[1].glob("docs/*.md"))
    texts = [p.read_text(encoding="utf-8") for p in docs] or [text for _, text in source_files(1)]
    return "\n\n".join(texts)


def session_messages(
    server: ServerProcess, turns: int, sizes: list[int], system_tokens: int = 0
) -> tuple[list[list[dict]], list[dict]]:
    """Each turn's messages (the whole conversation up to its tool result) and what each tool read;
    system_tokens > 0: the system prompt carries that many tokens of the project's guide too (coding
    agents send 10-30K tokens of rules, tool schemas and project notes before the first turn)."""
    files = source_files(4 * max(sizes))
    system = SYSTEM
    if system_tokens > 0:
        guide, _ = cut_to_tokens(server, project_guide(), system_tokens)
        system = f"{SYSTEM}\n\n# Project guide\n\n{guide}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": TASK}]
    prompts, reads = [], []
    for turn in range(turns):
        path, text = files[turn % len(files)]
        content, count = cut_to_tokens(server, text, sizes[turn])
        call = {"id": f"call_{turn + 1}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": json.dumps({"path": path})}
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": content},
        ]
        prompts.append(messages)
        reads.append({"path": path, "tool_tokens": count})
    return prompts, reads


def ask(c: Any, server: ServerProcess, messages: list[dict], max_tokens: int, cache: bool) -> dict[str, Any]:
    """One streamed request: server TTFT, client time to the first delta, cached tokens, the reply."""
    started = time.perf_counter()
    first, text, stats, usage = None, [], {}, None
    stream = c.chat.completions.create(
        model=server.model,
        messages=messages,
        tools=TOOLS,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={} if cache else {"prompt_cache": "off"},
    )
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            pieces = [delta.content or ""] + [
                (t.function.name or "") + (t.function.arguments or "") for t in delta.tool_calls or [] if t.function
            ]
            if first is None and any(pieces):
                first = time.perf_counter() - started
            text.extend(pieces)
        stats = (chunk.model_extra or {}).get("specfill") or stats
        usage = chunk.usage or usage
    return {
        "ttft_s": stats.get("ttft_s"),
        "first_delta_s": None if first is None else round(first, 6),
        "wall_s": round(time.perf_counter() - started, 6),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else 0,
        "completion_tokens": usage.completion_tokens if usage else None,
        "reply": "".join(text),
    }


def warm_up(c: Any, server: ServerProcess) -> None:
    """One short request that reads and writes no cache: the first request's one-off costs go here."""
    c.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=1,
        temperature=0,
        extra_body={"prompt_cache": "off"},
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2))
    os.replace(partial, path)


def wait_saved(server: ServerProcess, seconds: float = 600) -> dict[str, Any]:
    """Poll /health until the prompt cache has something on disk and no idle work left (a rebuild, or
    a write that waits for its quiet spell)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = server.health()["prompt_cache"]
        if state["disk_entries"] and not state["idle_work"]:
            return state
        time.sleep(0.2)
    return state


def run_session(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, cache_dir = out / f"{args.name}.json", out / f"{args.name}_cache"
    keys = ("model", "dtype", "threads", "turns", "tool_tokens", "system_tokens", "max_tokens")
    settings = {k: getattr(args, k) for k in keys}
    result: dict[str, Any] = {"settings": settings, "turns": [], "restart": []}
    if json_path.exists():
        old = json.loads(json_path.read_text())
        if old.get("settings") == settings:
            result = old
            log(f"resuming after turn {len(result['turns'])}")
    if not result["turns"]:
        shutil.rmtree(cache_dir, ignore_errors=True)  # a fresh session starts with an empty cache
    serve_args = ("--model", args.model, "--dtype", args.dtype, "--prompt-cache-dir", str(cache_dir))
    serve_args += ("--max-tokens", str(args.max_tokens), *args.serve_args)

    def start(tag: str) -> ServerProcess:
        return ServerProcess(*serve_args, log=out / f"{args.name}_{tag}.log", threads=args.threads, start_timeout=1800)

    if len(result["turns"]) == args.turns and len(result["restart"]) == args.turns:
        log("every turn is measured already: writing the report")
        write_report(result, out, args.name)
        return result
    server = start("serve")
    try:
        c = client(server, timeout=3600)
        warm_up(c, server)
        health = server.health()
        result["server"] = {k: health.get(k) for k in ("model", "backend", "device")}
        result["machine"] = describe_machine({"threads": args.threads})
        sizes = tool_sizes(args.tool_tokens, args.turns)
        prompts, reads = session_messages(server, args.turns, sizes, args.system_tokens)
        for turn in range(len(result["turns"]), args.turns):
            cached = ask(c, server, prompts[turn], args.max_tokens, cache=True)
            cold = ask(c, server, prompts[turn], args.max_tokens, cache=False)
            same = cached["reply"] == cold["reply"] and cached["completion_tokens"] == cold["completion_tokens"]
            result["turns"].append({"turn": turn + 1, **reads[turn], "cached": cached, "cold": cold, "equal": same})
            write_json(json_path, result)
            log(
                f"turn {turn + 1}: {cached['prompt_tokens']} tokens, {cached['cached_tokens']} cached, TTFT "
                f"{cached['ttft_s']} s cached vs {cold['ttft_s']} s cold, replies equal: {same}"
            )
        result["saved"] = wait_saved(server)
    finally:
        server.stop()
    server = start("restart")
    try:
        c = client(server, timeout=3600)
        warm_up(c, server)
        result["restart"] = []
        for turn in reversed(range(args.turns)):
            again = ask(c, server, prompts[turn], args.max_tokens, cache=True)
            again["equal"] = again["reply"] == result["turns"][turn]["cold"]["reply"]
            result["restart"].insert(0, {"turn": turn + 1, "order": args.turns - turn, **again})
            write_json(json_path, result)
            log(f"after restart, turn {turn + 1}: {again['cached_tokens']} cached, TTFT {again['ttft_s']} s")
    finally:
        server.stop()
    write_report(result, out, args.name)
    return result


def title(result: dict[str, Any]) -> str:
    s, server = result["settings"], result.get("server", {})
    name = Path(s["model"]).name or s["model"]
    return (
        f"Agent session: {len(result['turns'])} turns on {name} ({s['dtype']}, {server.get('backend')} "
        f"{server.get('device')}, {s['threads']} threads)"
    )


def write_report(result: dict[str, Any], out: Path, name: str) -> list[Path]:
    """<name>.json, <name>.md and <name>_ttft.png (TTFT per turn: cold, cached, after the restart)."""
    from .plots import plot_agent_session

    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    write_json(json_path, result)
    after = {r["turn"]: r for r in result.get("restart", [])}
    lines = [
        f"# {title(result)}",
        "",
        f"Machine: {machine_line(result['machine'])}. Settings: `{json.dumps(result['settings'])}`.",
        "TTFT is the server's (`specfill.ttft_s`: prefill and first token, no HTTP); cold is the same prompt",
        'with `prompt_cache: "off"`; after restart: a new server on the same `--prompt-cache-dir`, every',
        "turn's prompt again, the last turn first (read from disk), the others after it (their prefixes in memory).",
        "equal: the cached and cold replies match (text and token count).",
        "",
        "| turn | file | tool tokens | prompt tokens | cached tokens | TTFT cached (s) | TTFT cold (s) | "
        "cached / cold | equal | cached after restart | TTFT after restart (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in result["turns"]:
        cached, cold, again = t["cached"], t["cold"], after.get(t["turn"], {})
        ratio = cached["ttft_s"] / cold["ttft_s"] if cached["ttft_s"] and cold["ttft_s"] else None
        lines.append(
            f"| {t['turn']} | `{t['path']}` | {t['tool_tokens']} | {cached['prompt_tokens']} | "
            f"{cached['cached_tokens']} | {cached['ttft_s']} | {cold['ttft_s']} | "
            f"{'' if ratio is None else f'{ratio:.3f}'} | {t['equal']} | {again.get('cached_tokens', '')} | "
            f"{again.get('ttft_s', '')} |"
        )
    partial = md_path.with_name(md_path.name + ".partial")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, md_path)
    png = plot_agent_session(result["turns"], result.get("restart", []), out / f"{name}_ttft.png", title(result))
    return [json_path, md_path, png]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specfill.evaluation.agent_session", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="what `specfill serve --model` takes (a path, a hub spec)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--threads", type=int, default=2, help="the server's --threads (default: %(default)s)")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--tool-tokens", default="1000-4000", help="each tool result's tokens: N or LO-HI (%(default)s)")
    p.add_argument(
        "--system-tokens",
        type=int,
        default=0,
        help="tokens of the project's guide added to the system prompt, as agents send (default: %(default)s)",
    )
    p.add_argument("--max-tokens", type=int, default=16, help="the model's reply per turn (default: %(default)s)")
    p.add_argument("--out", default="results/agent_session", help="folder for the results (default: %(default)s)")
    p.add_argument("--name", default="agent_session", help="file name stem (default: %(default)s)")
    p.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="further `specfill serve` flags")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.turns < 1 or args.threads < 1 or args.max_tokens < 1 or args.system_tokens < 0:
        parser().error("--turns, --threads and --max-tokens must be positive, --system-tokens at least 0")
    try:
        tool_sizes(args.tool_tokens, args.turns)
    except ValueError as err:
        parser().error(str(err))
    run_session(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
