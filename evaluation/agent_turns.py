"""Agent turns accelerated (issue 46 item 7): per turn of a coding agent's session over a cached
conversation, the TTFT of the new part under full prefill, SpecPrefill and the composition (SpecPrefill
over an H2O speculator; on request also `nested`, SpecPrefill with a nested speculator, and `auto`), each with
the prompt cache, and a question per turn about a fact inside that turn's tool result, answered by each.

    python -m specfill.evaluation.agent_turns --model MAIN --speculator SMALL [--dtype float32]
        [--system-tokens 8000] [--tool-tokens 2000,4000,8000] [--methods full,specprefill,composition]
        [--out results/agent_session] [--name agent_turns]

The session (evaluation/agent_session.py's agent: its system prompt, tools and task, with
--system-tokens of the project's guide in the system prompt): per turn a scripted read_file call, its
result (this package's source files, one after the other, cut to the turn's size, with one planted line
`<NAME> = <5-digit number>` at a depth that moves from turn to turn), then a user question "what is
<NAME> set to in the file you just read?"; the model's reply (greedy, --max-tokens) is the answer,
correct when it holds the number. The next turn carries a scripted assistant answer (the number), so
that every method sees the same prompts.

Run: one seed server prefills the system prompt and task (`method` specprefill, so that the speculator
keeps its own KV of it; the exact policy then rebuilds the main model's KV densely in idle time) and
saves it to its `--prompt-cache-dir`; then, per method, a server on a copy of that directory plays the
turns in order, waiting after each for the idle work (the dense rebuild of a sparse turn and the disk
write) to finish, as an agent's tool call would leave it time (`auto`'s server runs `--method auto`, so it
calibrates before it listens, as `specfill serve` does for a user); at the end the same short follow-up
(full prefill, a few new tokens over the whole conversation) goes to every method's server: its reply
must equal full's, i.e. the rebuilt conversation is the dense one. TTFT is the server's
(`specfill.ttft_s`, prefill and first token, no HTTP); `new` is prompt minus cached tokens. The JSON is
written after every turn; the Markdown table and `<name>_ttft.png` at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from specfill.core.config import AUTO_COMPOSITION

from .agent_session import SYSTEM, TASK, TOOLS, cut_to_tokens, project_guide, source_files, warm_up, write_json
from .machine import describe_machine, machine_line
from .serve_process import ServerProcess, client

METHODS = {  # request fields per method (the server's defaults otherwise)
    "full": {"method": "full"},
    "specprefill": {"method": "specprefill"},
    "composition": {"method": "specprefill", "speculator_prefill": "h2o"},
    "auto": {"method": "auto"},  # this machine's calibrations, a turn weighed on turn calibrations (core/probe.py)
    # SpecPrefill with auto's nested speculator: its second half reads the 30% the first half ranks first
    "nested": {
        "method": "specprefill",
        "deep_keep": AUTO_COMPOSITION.deep_keep,
        "deep_from": AUTO_COMPOSITION.deep_from,
    },
}


def server_flags(tag: str) -> tuple[str, ...]:
    """The flags of the server that runs `tag` (a method of METHODS, or "seed") besides the model's: `auto`'s
    is served as a user serves it, `--method auto`, calibrated before it listens (core/probe.calibrate_auto),
    so that no turn's TTFT holds the probe; the others take each request's method."""
    return ("--method", "auto") if tag == "auto" else ()


NAMES = ("RETRY_WINDOW_MS", "SHARD_LIMIT", "BACKOFF_CEILING", "PAGE_BUDGET", "LEASE_TIMEOUT_S", "QUEUE_HIGH_WATER")
DEPTHS = (0.35, 0.6, 0.8, 0.5, 0.25, 0.7)  # where in its tool result each turn's fact sits


def fact(turn: int) -> tuple[str, str]:
    """Turn t's planted name and value (a 5-digit number no source file holds by chance)."""
    return NAMES[turn % len(NAMES)], str(40000 + (7919 * (turn + 3)) % 50000)


def plant(text: str, turn: int) -> str:
    """The text with turn's fact as its own line at DEPTHS[turn] of its lines."""
    name, value = fact(turn)
    lines = text.split("\n")
    at = max(1, int(len(lines) * DEPTHS[turn % len(DEPTHS)]))
    return "\n".join(lines[:at] + [f"{name} = {value}"] + lines[at:])


def question(turn: int) -> str:
    name, _ = fact(turn)
    return f"In the files you just read, what is {name} set to? Reply with the number only."


def read_files(server: ServerProcess, files: list[tuple[str, str]], turn: int, size: int) -> tuple[str, str]:
    """Turn's tool result: source files from the turn's place on, each under a `==> path <==` line (as
    `head` prints several), cut to `size` tokens; the path read_file was called with (a folder)."""
    texts, chars, i = [], 0, (7 * turn) % len(files)
    while chars < 6 * size:  # a token is 3-4 characters of code: enough to cut from
        path, text = files[i % len(files)]
        texts.append(f"==> {path} <==\n{text}")
        chars, i = chars + len(text), i + 1
    content, _ = cut_to_tokens(server, "\n".join(texts), size)
    return str(Path(files[(7 * turn) % len(files)][0]).parent), content


def build_turns(server: ServerProcess, sizes: list[int], system_tokens: int) -> tuple[list[dict], list[list[dict]]]:
    """The seed messages' prompt (system + task) and each turn's whole conversation up to its question."""
    files = source_files(1)
    guide, _ = cut_to_tokens(server, project_guide(), system_tokens)
    system = f"{SYSTEM}\n\n# Project guide\n\n{guide}" if system_tokens > 0 else SYSTEM
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": TASK}]
    seed, turns = list(messages), []
    for turn, size in enumerate(sizes):
        path, content = read_files(server, files, turn, size)
        call = {"id": f"call_{turn + 1}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": json.dumps({"path": path})}
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": plant(content, turn)},
            {"role": "user", "content": question(turn)},
        ]
        turns.append(messages)
        messages = messages + [{"role": "assistant", "content": fact(turn)[1]}]  # the scripted answer
    return seed, turns


def ask(c: Any, server: ServerProcess, messages: list[dict], fields: dict, max_tokens: int) -> dict[str, Any]:
    """One request (not streamed): server TTFT, prompt / cached tokens, the reply and what ran."""
    started = time.perf_counter()
    reply = c.chat.completions.create(
        model=server.model, messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=0, extra_body=fields
    )
    stats = (reply.model_extra or {}).get("specfill") or {}
    usage = reply.usage
    details = usage.prompt_tokens_details if usage else None
    cached = (details.cached_tokens if details else 0) or 0
    return {
        "ttft_s": stats.get("ttft_s"),
        "wall_s": round(time.perf_counter() - started, 3),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": cached,
        "new_tokens": (usage.prompt_tokens - cached) if usage else None,
        "kept_tokens": stats.get("kept_tokens"),
        "prefill_method": stats.get("prefill_method"),
        "prefill_seconds": stats.get("prefill_seconds") or {},
        "reply": reply.choices[0].message.content or "",
    }


def settle(server: ServerProcess, seconds: float = 7200) -> dict[str, Any]:
    """Wait for the prompt cache's idle work (dense rebuild, speculator build-up, disk writes) to finish."""
    deadline, state = time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        state = server.health()["prompt_cache"]
        if not state["idle_work"]:
            return state
        time.sleep(0.5)
    raise RuntimeError(f"the prompt cache's idle work did not finish in {seconds} s: {state}")


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, seed_dir = out / f"{args.name}.json", out / f"{args.name}_cache_seed"
    keys = ("model", "speculator", "dtype", "threads", "system_tokens", "tool_tokens", "max_tokens", "methods")
    settings = {k: getattr(args, k) for k in keys}
    result: dict[str, Any] = {"settings": settings, "runs": {}}
    if json_path.exists() and json.loads(json_path.read_text()).get("settings") == settings:
        result = json.loads(json_path.read_text())
        log(f"resuming: {', '.join(result['runs'])} done")
    sizes = [int(s) for s in args.tool_tokens.split(",")]
    serve_args = ("--model", args.model, "--speculator", args.speculator, "--dtype", args.dtype)

    def start(tag: str, cache: Path) -> ServerProcess:
        return ServerProcess(
            *serve_args, *server_flags(tag), "--prompt-cache-dir", str(cache), log=out / f"{args.name}_{tag}.log",
            threads=args.threads, start_timeout=1800,
        )  # fmt: skip

    if "seed" not in result or not seed_dir.exists():  # a resumed run whose seed cache is gone: seeded again
        shutil.rmtree(seed_dir, ignore_errors=True)
        server = start("seed", seed_dir)
        try:
            c = client(server, timeout=7200)
            warm_up(c, server)
            result["server"] = {k: server.health().get(k) for k in ("model", "backend", "device")}
            result["machine"] = describe_machine({"threads": args.threads})
            if "prompts" in result:  # the same conversation as the methods already run (docs may have changed)
                seed, turns = result["prompts"]["seed"], result["prompts"]["turns"]
            else:
                seed, turns = build_turns(server, sizes, args.system_tokens)
            result["seed"] = ask(c, server, seed, METHODS["specprefill"], 1)
            result["seed"]["settled"] = settle(server)
            result["prompts"] = {"seed": seed, "turns": turns}
            write_json(json_path, result)
            log(f"seed: {result['seed']['prompt_tokens']} tokens, TTFT {result['seed']['ttft_s']} s")
        finally:
            server.stop()
    turns = result["prompts"]["turns"]
    follow_up = turns[-1] + [
        {"role": "assistant", "content": fact(len(turns) - 1)[1]},
        {"role": "user", "content": "Which tool did you call last? Answer in one word."},
    ]
    for method in args.methods.split(","):
        if method in result["runs"]:
            continue
        cache = out / f"{args.name}_cache_{method}"
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(seed_dir, cache)
        server = start(method, cache)
        rows = []
        try:
            c = client(server, timeout=7200)
            warm_up(c, server)
            for turn, messages in enumerate(turns):
                row = ask(c, server, messages, METHODS[method], args.max_tokens)
                row["turn"], row["fact"] = turn + 1, fact(turn)[1]
                row["answered"] = fact(turn)[1] in row["reply"]
                settle_started = time.perf_counter()
                settle(server)
                row["idle_work_s"] = round(time.perf_counter() - settle_started, 3)
                rows.append(row)
                log(
                    f"{method} turn {turn + 1}: {row['prompt_tokens']} tokens, {row['cached_tokens']} cached, "
                    f"{row['kept_tokens']} kept, TTFT {row['ttft_s']} s, answered {row['answered']} "
                    f"({row['reply']!r}), idle work {row['idle_work_s']} s"
                )
            check = ask(c, server, follow_up, METHODS["full"], args.max_tokens)
        finally:
            server.stop()
        result["runs"][method] = {"turns": rows, "follow_up": check}
        write_json(json_path, result)
        shutil.rmtree(cache, ignore_errors=True)
    write_report(result, out, args.name)
    return result


def title(result: dict[str, Any]) -> str:
    s, server = result["settings"], result.get("server", {})
    return (
        f"Agent turns: {Path(s['model']).name} + {Path(s['speculator']).name} ({s['dtype']}, "
        f"{server.get('backend')} {server.get('device')}, {s['threads']} threads)"
    )


def parts(seconds: dict[str, float]) -> str:
    """A turn's prefill parts, the largest first ("speculator 12.3, main_prefill 40.1"); "" when
    the run recorded none (runs before the field)."""
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]))


def write_report(result: dict[str, Any], out: Path, name: str) -> list[Path]:
    """<name>.md and <name>_ttft.png beside <name>.json."""
    from .plots import plot_agent_turns

    runs = result["runs"]
    full = {r["turn"]: r for r in runs.get("full", {}).get("turns", [])}
    lines = [
        f"# {title(result)}",
        "",
        f"Machine: {machine_line(result['machine'])}. Settings: `{json.dumps(result['settings'])}`.",
        f"Seed (system prompt + task, {result['seed']['prompt_tokens']} tokens) prefilled once and cached "
        "for every method. TTFT: the server's, over the cached conversation; new = prompt - cached tokens;",
        "x full: full's TTFT on the same turn / this one's. answered: the reply holds the planted number. ran: the "
        "prefill method the server ran (what `auto` chose).",
        "parts: the prefill's parts in seconds, as the server reports them (`prefill_seconds`).",
        "",
        "| method | ran | turn | prompt | cached | new | kept | TTFT (s) | x full | answered | reply | idle work (s) "
        "| parts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, run in runs.items():
        for r in run["turns"]:
            base = full.get(r["turn"], {}).get("ttft_s")
            ratio = f"{base / r['ttft_s']:.2f}" if base and r["ttft_s"] else ""
            lines.append(
                f"| {method} | {r.get('prefill_method') or ''} | {r['turn']} | {r['prompt_tokens']} | "
                f"{r['cached_tokens']} | {r['new_tokens']} | "
                f"{r['kept_tokens']} | {r['ttft_s']:.2f} | {ratio} | {r['answered']} | `{r['reply'][:40]!r}` | "
                f"{r['idle_work_s']} | {parts(r.get('prefill_seconds') or {})} |"
            )
    lines += ["", "Follow-up (full prefill of a few tokens over each server's whole conversation):", ""]
    reference = runs.get("full", {}).get("follow_up", {}).get("reply")
    for method, run in runs.items():
        f = run["follow_up"]
        same = "" if reference is None else f", equal to full: {f['reply'] == reference}"
        lines.append(f"- {method}: cached {f['cached_tokens']} of {f['prompt_tokens']}, reply {f['reply']!r}{same}")
    md = out / f"{name}.md"
    partial = md.with_name(md.name + ".partial")
    partial.write_text("\n".join(lines) + "\n")
    partial.replace(md)
    png = plot_agent_turns(runs, out / f"{name}_ttft.png", title(result))
    return [out / f"{name}.json", md, png]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specfill.evaluation.agent_turns", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="the main model (what `specfill serve --model` takes)")
    p.add_argument("--speculator", required=True, help="the speculator (`specfill serve --speculator`)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--system-tokens", type=int, default=8000, help="project guide tokens in the system prompt")
    p.add_argument("--tool-tokens", default="2000,4000,8000", help="each turn's tool result tokens, comma-separated")
    p.add_argument("--max-tokens", type=int, default=12, help="the reply per turn (default: %(default)s)")
    p.add_argument("--methods", default="full,specprefill,composition", help=f"some of {', '.join(METHODS)}")
    p.add_argument("--out", default="results/agent_session")
    p.add_argument("--name", default="agent_turns")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        sizes = [int(s) for s in args.tool_tokens.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        parser().error(f"--tool-tokens must be positive integers separated by commas, got {args.tool_tokens!r}")
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        parser().error(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(METHODS)})")
    if args.threads < 1 or args.max_tokens < 1 or args.system_tokens < 0:
        parser().error("--threads and --max-tokens must be positive, --system-tokens at least 0")
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
