"""The larger hostile-input run of issue #17: the corpus of tests/test_fuzz_inputs.py with every
architecture and more random flips and cuts, on both backends, plus every CLI case of the issue as
a `python -m specfill` subprocess; run twice, and the two runs must be identical.

    python scripts/fuzz_inputs.py --out results/fuzz        # -> fuzz.json, fuzz.md

Model cases run in a worker process that reports one JSON line per case, so a crash or a hang in
native code is caught and attributed to its case (then the worker restarts after it).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASE_LIMIT_S, CLI_LIMIT_S = 60.0, 120.0
CORPUS = dict(seed=17, archs=("llama", "qwen2", "qwen3"), n_flips=150, n_cuts=40)
SMOKE = bool(os.environ.get("SPECFILL_FUZZ_SMOKE"))  # a quick check of this script itself: a small corpus
if SMOKE:
    CORPUS.update(archs=("llama",), n_flips=2, n_cuts=2)
BACKENDS = ("cuda", "mlx")


def worker(start: int, folder: Path) -> None:
    """Run cases from `start` on, printing `start <i>` before and the outcome after each."""
    import torch

    from tests.fixtures.fuzz_run import corpus, run_case

    torch.set_num_threads(1)
    for index, (name, write) in enumerate(corpus(folder / "corpus", **CORPUS)):
        if index < start:
            continue
        case_dir = folder / f"case{index:05d}"
        case_dir.mkdir(parents=True, exist_ok=True)
        path = write(case_dir)
        for backend in BACKENDS:
            print(f"start {index} {backend}", flush=True)
            outcome = asdict(run_case(name, path, backend, CASE_LIMIT_S))
            outcome["message"] = outcome["message"].replace(str(case_dir), "<case>")
            print(json.dumps({"index": index, **outcome}), flush=True)


def model_cases(folder: Path) -> list[dict]:
    """Every corpus case on both backends, restarting the worker after a crash or a hang."""
    outcomes, start = [], 0
    while True:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(start), "--folder", str(folder)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        current = None
        while True:
            if not selector.select(timeout=CASE_LIMIT_S * 2):
                proc.kill()
                status = "hang"
                break
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                status = None if proc.returncode == 0 else f"crash (exit {proc.returncode})"
                break
            if line.startswith("start "):
                current = line.split()[1:]
            elif line.startswith("{"):
                outcomes.append(json.loads(line))
                current = None
        if status is None:
            return outcomes
        if current is None:  # died between cases (while generating the corpus, say)
            outcomes.append(
                {
                    "index": start,
                    "case": "#worker",
                    "backend": "",
                    "status": status,
                    "error_type": "",
                    "message": "",
                    "seconds": 0.0,
                }
            )
            return outcomes
        outcomes.append(
            {
                "index": int(current[0]),
                "case": f"#{current[0]}",
                "backend": current[1],
                "status": status,
                "error_type": "",
                "message": "",
                "seconds": CASE_LIMIT_S,
            }
        )
        start = int(current[0]) + 1


def cli_cases(folder: Path) -> list[dict]:
    """The issue's CLI cases (settings and hostile models) as subprocesses on both backends."""
    from tests.fixtures.cli_cases import MODEL_CASES, SETTINGS, CliCase, cli_args, cli_files
    from tests.fixtures.fuzz_run import corpus

    files = cli_files(folder / "cli")
    cases = list(SETTINGS)[:3] if SMOKE else list(SETTINGS)
    for name, write in corpus(folder / "cli-corpus", **{**CORPUS, "archs": ("llama",), "n_flips": 0, "n_cuts": 0}):
        if name in MODEL_CASES and not (SMOKE and len(cases) >= 5):
            case_dir = folder / "cli-models" / str(len(cases))
            case_dir.mkdir(parents=True)
            cases.append(CliCase(name, ("--model", write(case_dir)), 2, MODEL_CASES[name]))
    results = []
    for case in cases:
        for backend in BACKENDS:
            result = _run_cli(case, cli_args(case, files, backend), backend)
            results.append({**result, "line": result["line"].replace(str(folder), "<tmp>")})
    return results


def _run_cli(case, args: list[str], backend: str) -> dict:
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "specfill", *args],
            input=case.stdin,
            capture_output=True,
            timeout=CLI_LIMIT_S,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    except subprocess.TimeoutExpired:
        return {"case": case.name, "backend": backend, "status": "hang", "exit": None, "line": ""}
    err = [
        line
        for line in proc.stderr.decode(errors="replace").splitlines()
        if not line.startswith("specfill: no CUDA GPU")
    ]
    errors = [line for line in err if line.startswith("specfill: error: ")]
    warns = [line for line in err if line.startswith("specfill: warning: ")]
    line = (errors or warns or [""])[0]
    good = (
        proc.returncode == case.exit_code
        and "Traceback" not in proc.stderr.decode(errors="replace")
        and len(err) == len(errors) + len(warns)
        and case.word in line
        and (len(errors) == 1 if case.exit_code == 2 else not errors)
    )
    return {
        "case": case.name,
        "backend": backend,
        "status": "pass" if good else "fail",
        "exit": proc.returncode,
        "line": line.replace(str(ROOT), "<repo>")[:300],
        "seconds": round(time.perf_counter() - start, 2),
    }


def header_timings(folder: Path) -> dict[str, float]:
    """Best of three rejection / parse times of the 12 MB hostile headers."""
    from specfill.core.errors import ModelLoadError
    from specfill.core.io.gguf_file import read_gguf
    from tests.fixtures.fuzz_run import corpus

    wanted = (
        "gguf/llama/header/1e6-empty-arrays",
        "gguf/llama/header/1.5e6-empty-strings",
        "gguf/llama/header/nested-array-depth=3000",
        "gguf/llama/header/100k-keys",
    )
    timings = {}
    for name, write in corpus(folder / "timing", **{**CORPUS, "archs": ("llama",), "n_flips": 0, "n_cuts": 0}):
        if name in wanted:
            (folder / "timing" / name.replace("/", "_")).mkdir(parents=True)
            path = write(folder / "timing" / name.replace("/", "_"))
            best = []
            for _ in range(3):
                start = time.perf_counter()
                try:
                    read_gguf(path).close()
                except ModelLoadError:
                    pass
                best.append(time.perf_counter() - start)
            timings[f"{name} ({os.path.getsize(path) / 1e6:.1f} MB)"] = round(min(best), 3)
    return timings


def _comparable(outcomes: list[dict]) -> list[tuple]:
    return [tuple(v for k, v in sorted(o.items()) if k != "seconds") for o in outcomes]


def _family(case: str) -> str:
    """gguf/<arch>/meta/... -> gguf/*/meta; dir/config/... -> dir/config."""
    parts = case.split("/")
    return f"gguf/*/{parts[2]}" if parts[0] == "gguf" else "/".join(parts[:2])


def summarize(models: list[dict], cli: list[dict]) -> dict:
    families = collections.Counter((_family(o["case"]), o["backend"], o["status"]) for o in models)
    by_case = collections.defaultdict(dict)
    for o in models:
        by_case[o["case"]][o["backend"]] = o["status"]
    return {
        "model_cases": len(by_case),
        "model_runs": len(models),
        "model_status": dict(collections.Counter(f"{o['backend']} {o['status']}" for o in models)),
        "failures": [o for o in models if o["status"] not in ("ok", "error")],
        "backends_disagree": sorted(c for c, s in by_case.items() if len(set(s.values())) > 1),
        "families": {" | ".join(k): v for k, v in sorted(families.items())},
        "cli_cases": len(cli),
        "cli_failures": [c for c in cli if c["status"] != "pass"],
        "slowest_model_cases": sorted(
            ({"case": o["case"], "backend": o["backend"], "seconds": o["seconds"]} for o in models),
            key=lambda o: -o["seconds"],
        )[:5],
    }


def write_markdown(report: dict, path: Path) -> None:
    s = report["summary"]
    lines = [
        "# Hostile inputs: fuzz run (issue #17)",
        "",
        f"Machine: {report['machine']}",
        "",
        f"- model cases: {s['model_cases']} generated bad model files / directories / special files, "
        f"{s['model_runs']} loads ({', '.join(BACKENDS)} backends)",
        f"- outcomes: {', '.join(f'{k}: {v}' for k, v in sorted(s['model_status'].items()))}",
        f"- tracebacks / foreign exception types / hangs / crashes / non-finite successes: {len(s['failures'])}",
        f"- cases the two backends treat differently: {len(s['backends_disagree'])}",
        f"- CLI cases: {s['cli_cases']} runs, failures: {len(s['cli_failures'])} (each error one line, exit 2; "
        f"clamps and unused settings exit 0 with one warning)",
        f"- second run identical: {report['second_run_identical']}",
        "",
        "## 12 MB hostile headers (read_gguf, best of 3)",
        "",
        "| header | seconds |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in report["header_seconds"].items()]
    lines += ["", "## Outcomes by family", "", "| family | backend | status | cases |", "|---|---|---|---|"]
    lines += [f"| {k.replace(' | ', ' | ')} | {v} |" for k, v in s["families"].items()]
    lines += ["", "## CLI cases", "", "| case | backend | exit | result | line |", "|---|---|---|---|---|"]
    lines += [f"| {c['case']} | {c['backend']} | {c['exit']} | {c['status']} | `{c['line']}` |" for c in report["cli"]]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "fuzz")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.folder)
        return 0
    from evaluation.machine import describe_machine, machine_line

    runs = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            runs.append((model_cases(Path(tmp) / "models"), cli_cases(Path(tmp)), time.perf_counter() - started))
    (models, cli, seconds), (models2, cli2, _) = runs
    report = {
        "machine": machine_line(describe_machine()),
        "corpus": {**CORPUS, "case_limit_s": CASE_LIMIT_S},
        "seconds_per_run": round(seconds, 1),
        "second_run_identical": (_comparable(models), _comparable(cli)) == (_comparable(models2), _comparable(cli2)),
        "second_run_differences": [
            (a, b)
            for a, b in zip(_comparable(models) + _comparable(cli), _comparable(models2) + _comparable(cli2))
            if a != b
        ][:10],
        "header_seconds": header_timings(Path(tempfile.mkdtemp())),
        "summary": summarize(models, cli),
        "cli": cli,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fuzz.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, args.out / "fuzz.md")
    s = report["summary"]
    print(
        f"{s['model_cases']} model cases, {len(s['failures'])} failures, {len(s['backends_disagree'])} "
        f"disagreements, {len(s['cli_failures'])} CLI failures, "
        f"second run identical: {report['second_run_identical']}"
    )
    clean = not (s["failures"] or s["cli_failures"] or s["backends_disagree"])
    return 0 if clean and report["second_run_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
