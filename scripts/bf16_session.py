"""The bf16 CPU session in one command (issues 46 and 47): every figure their acceptance lines ask of
the Qwen2.5-Coder pair in bfloat16 on a CPU with bf16 units (AVX-512 BF16 or AMX), in the order that
closes the most, each step resumable, the whole inside a time budget.

    .venv/bin/python scripts/bf16_session.py                  # every step -> results/cpu_bf16/
    .venv/bin/python scripts/bf16_session.py --steps summary  # the acceptance table from what is there

Steps, in order; each runs alone as a subprocess (its output in OUT/<step>.log; its start, seconds and
exit code in OUT/session.log):
  machine  CPU model and flags, cores, load, versions                       -> machine.json
  turns    issue 46 line 1: evaluation/agent_turns (an 8K-token system prompt, tool results of 2K,
           4K and 8K tokens; full, SpecPrefill and the composition over the prompt cache)
                                                                            -> agent_turns.{json,md,png}
  long     issue 47 lines 1-2 (speed): `specfill bench`, full and auto at 16K and 32K, one run each
                                                                            -> bench_long.{json,md,png}
  ruler    issue 47 line 1 (answers): RULER at 16K, niah_multikey_2, niah_multivalue, vt and qa_1, 8
           samples each, full and auto's composition (core/config.AUTO_COMPOSITION as a candidate:
           what auto runs at 16K when its calibration picks the composition) decoded
                                                                            -> ruler_16k.{json,md,png}
  bench    issue 47 item 5: the table's other rows: every method at 8K, H2O, SpecPrefill and the
           composition at 16K and 32K (full and auto there are `long`'s)   -> bench_8k.*, bench_rest.*
  fixes    issue 47 item 1: the composition's default and its two H2O-side fixes (H2O in the
           speculator's last two thirds; a memory of 10% with S 2048) decoded on the same RULER
           samples, their TTFTs timed end to end                          -> ruler_16k.* (same records)
  summary  every acceptance line of issues 46 and 47 from those files, the roofline's 128K table
           (research/roofline/results/roofline.json) and the decoded 4K frontier
           (results/eval/ruler/frontier/decoded_4k.json)                    -> acceptance.{md,json}

Resuming: agent_turns resumes per method, RULER sample by sample (its records are written one by one:
commit OUT between sessions and the next bf16 session continues), a bench whose JSON is complete with
every row asked is not run again. Budget: a step's limit is what is left of --budget-s minus the
shares of the steps after it (SHARES), so `ruler` takes what `turns` and `long` leave (but the
summary's share) and `bench` runs only after it; a step out of time is stopped (its process group:
the servers agent_turns starts too) and the next one runs.

Refuses, in one line with exit code 2: bfloat16 on a CPU without bf16 units (there bf16 is ~50x
slower than float32: not the figures the issues ask; --force runs anyway and the summary says the
figures do not count), and a model file that is missing (../shared/models/fetch_qwen_coder_pair.sh).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bf16_acceptance import AUTO_NAME, SPEED_METHODS, summary, write  # its sibling: the acceptance lines

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("machine", "turns", "long", "ruler", "bench", "fixes", "summary")
# seconds kept for each step while an earlier one runs (the ruler and bench steps take what is left)
SHARES = {"machine": 5, "turns": 2400, "long": 1500, "ruler": 0, "bench": 0, "fixes": 0, "summary": 60}
# issue 47 item 1's candidates: the composition's default (keep 0.3) and its two H2O-side fixes
FIXES = ("c+h2o 0.3:", "last 0.3:h2o_layers=last-0.67", "mem 0.3:h2o_memory_share=0.1,h2o_chunk_size=2048")
MIN_STEP_S = 30  # a step with less than this left is skipped, not started
MODELS = Path(os.environ.get("SPECFILL_CACHE", Path.home() / ".cache" / "specfill")) / "models"
MAIN = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SPECULATOR = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
RULER_TASKS = ("niah_multikey_2", "niah_multivalue", "vt", "qa_1")  # issue 47's 16K line


def auto_candidate() -> str:
    """core/config.AUTO_COMPOSITION as an eval candidate: the fields it sets apart from SpecPrefill's
    defaults (its speculator's H2O is what "+h2o" in the name means: speculator_h2o(), every layer)."""
    from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig

    base = SpecPrefillConfig()
    fields = [
        f"{f.name}={getattr(AUTO_COMPOSITION, f.name)}"
        for f in dataclasses.fields(AUTO_COMPOSITION)
        if f.name != "speculator_prefill" and getattr(AUTO_COMPOSITION, f.name) != getattr(base, f.name)
    ]
    return f"{AUTO_NAME}:{','.join(fields)}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma list, in this order: {', '.join(STEPS)}")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "cpu_bf16")
    p.add_argument("--budget-s", type=float, default=9000.0, help="the whole session (default 2.5 h)")
    p.add_argument("--model", default=str(MAIN))
    p.add_argument("--speculator", default=str(SPECULATOR))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--force", action="store_true", help="run bf16 on a CPU without bf16 units (figures do not count)")
    # sizes: the issues' by default; smaller ones only to exercise the steps (tests/test_bf16_session.py)
    p.add_argument("--system-tokens", type=int, default=8000)
    p.add_argument("--tool-tokens", default="2048,4096,8192")
    # 32000, not 32768: the pair's context is 32,768 tokens, the prompt and its decoded tokens fit in it
    p.add_argument("--long-lengths", default="16384,32000")
    p.add_argument("--bench-length", default="8192")
    p.add_argument("--ruler-length", type=int, default=16000)
    p.add_argument("--ruler-tasks", default=",".join(RULER_TASKS))
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--cache-dir", default=None, help="specfill eval --cache-dir (default: its own)")
    p.add_argument("--turn-threshold", type=int, default=4096, help="issue 46: turns whose new part has >= this")
    p.add_argument("--shares", default="", help="step=seconds,... in place of SHARES' (a shorter budget)")
    args = p.parse_args(argv)
    try:
        args.shares = {**SHARES, **{k: float(v) for k, v in (w.split("=") for w in args.shares.split(",") if w)}}
    except ValueError:
        p.error(f"--shares takes step=seconds,... (got {args.shares!r})")
    if set(args.shares) - set(STEPS):
        p.error(f"--shares: unknown step {', '.join(sorted(set(args.shares) - set(STEPS)))}")
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"--steps: unknown {', '.join(unknown)} (known: {', '.join(STEPS)})")
    args.steps = [s for s in STEPS if s in steps]
    return args


def refusal(args: argparse.Namespace) -> str | None:
    """Why this session must not run (one line), or None."""
    from specfill.core.cpu import has_fast_bf16

    if args.dtype == "bfloat16" and not has_fast_bf16() and not args.force and args.steps != ["summary"]:
        return (
            "this CPU has no bf16 units (no avx512_bf16 / amx_bf16 in /proc/cpuinfo): bf16 runs ~50x slower "
            "here and are not the figures issues 46 and 47 ask (--force runs anyway)"
        )
    for flag in ("model", "speculator"):
        value = getattr(args, flag)
        if args.steps != ["summary"] and not value.startswith(("random:", "self:")) and not Path(value).exists():
            return f"--{flag} {value} is missing (../shared/models/fetch_qwen_coder_pair.sh fetches the pair)"
    return None


def common(args: argparse.Namespace) -> list[str]:
    models = ["--model", args.model, "--speculator", args.speculator]
    return models + ["--dtype", args.dtype, "--threads", str(args.threads)]


def bench_argv(args: argparse.Namespace, name: str, methods: str, lengths: str) -> list[str]:
    head = [sys.executable, "-m", "specfill.cli.main", "bench", "--backends", "cuda", "--device", "cpu"]
    return head + common(args) + [
        "--methods", methods, "--lengths", lengths, "--repeats", "1", "--decode-tokens", "4",
        "--out", str(args.out), "--name", name,
    ]  # fmt: skip


def commands(args: argparse.Namespace) -> dict[str, list[tuple[str, list[str]]]]:
    """(name, argv) of each step's runs; a bench named here is skipped once its JSON is complete."""
    py = sys.executable
    lengths = args.long_lengths.split(",")

    def ruler(*candidates: str) -> list[str]:  # one record file: a later run adds to it, full's answers reused
        return [py, "-m", "specfill.cli.main", "eval", "--backend", "cuda", "--device", "cpu"] + common(args) + [
            "--tasks", args.ruler_tasks, "--ruler-lengths", str(args.ruler_length), "--trials", str(args.trials),
            "--candidates", "full", *candidates, "--out", str(args.out), "--name", "ruler_16k",
        ] + (["--cache-dir", args.cache_dir] if args.cache_dir else [])  # fmt: skip

    return {
        "turns": [
            (
                "agent_turns",
                [py, "-m", "specfill.evaluation.agent_turns"]
                + common(args)
                + [
                    "--system-tokens",
                    str(args.system_tokens),
                    "--tool-tokens",
                    args.tool_tokens,
                    "--out",
                    str(args.out),
                    "--name",
                    "agent_turns",
                ],  # fmt: skip
            )
        ],
        "long": [("bench_long", bench_argv(args, "bench_long", "full,auto", ",".join(lengths)))],
        "ruler": [("ruler_16k", ruler(auto_candidate()))],
        "bench": [
            ("bench_8k", bench_argv(args, "bench_8k", ",".join(SPEED_METHODS), args.bench_length)),
            ("bench_rest", bench_argv(args, "bench_rest", "h2o,specprefill,specprefill+h2o", ",".join(lengths))),
        ],
        "fixes": [("ruler_16k", ruler(*FIXES))],
    }


def bench_done(path: Path, argv: list[str]) -> bool:
    """A bench JSON that is complete with a row for every method and length argv asks."""
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    methods = argv[argv.index("--methods") + 1].split(",")
    lengths = [int(n) for n in argv[argv.index("--lengths") + 1].split(",")]
    rows = {(r["method"], r["prompt_tokens"]) for r in data.get("rows", []) if r.get("ttft_s")}
    return bool(data.get("complete")) and all((m, n) in rows for m in methods for n in lengths)


def run_one(argv: list[str], log: Path, limit: float) -> int:
    """argv in its own process group, output appended to log; stopped (the group: SIGTERM, then
    SIGKILL after 20 s) at `limit` seconds; its exit code, 124 when it ran out of time."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.write(f"stopped: out of time after {limit:.0f} s\n")
            return 124


def machine(args: argparse.Namespace) -> int:
    from specfill.evaluation.machine import describe_machine

    info = describe_machine({"threads": args.threads})
    info.update({"dtype": args.dtype, "load_average": os.getloadavg(), "forced": args.force})
    write(args.out / "machine.json", json.dumps(info, indent=1) + "\n")
    return 0


def run(args: argparse.Namespace, log=print) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    session = args.out / "session.log"
    started, failed = time.monotonic(), 0
    runs = commands(args)
    for i, step in enumerate(args.steps):
        left = args.budget_s - (time.monotonic() - started)
        limit = left - sum(args.shares[s] for s in args.steps[i + 1 :])
        began = time.monotonic()
        note = f"{step}: start at {time.strftime('%H:%M:%S')}, limit {limit:.0f} s"
        if limit < MIN_STEP_S and step not in ("machine", "summary"):
            code, note = 0, f"{step}: skipped, {limit:.0f} s left for it"
        elif step == "machine":
            code = machine(args)
        elif step == "summary":
            code = summary(args)
        else:
            code = 0
            for name, argv in runs[step]:
                if name.startswith("bench") and bench_done(args.out / f"{name}.json", argv):
                    continue
                spent = time.monotonic() - began
                code = max(code, run_one(argv, args.out / f"{step}.log", limit - spent))
        failed += code != 0
        line = f"{note}\n{step}: {time.monotonic() - began:.0f} s, exit {code}"
        with session.open("a") as out:
            out.write(line + "\n")
        log(line)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = refusal(args)
    if why is not None:
        print(f"bf16_session: {why}", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
