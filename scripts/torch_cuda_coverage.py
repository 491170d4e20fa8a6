"""Line coverage of backends/torch_cuda/ before and after the simulated-GPU tests (issue 22, item 2).

    .venv/bin/pip install coverage      # a measurement tool, not a dependency of specfill
    .venv/bin/python scripts/torch_cuda_coverage.py [--out results/gpu]

"before": the torch backend's tests without the CUDA-path tests (tests/torch_cuda/test_cuda_paths.py,
which run the CUDA-only branches on CPU tensors through placement.simulated_cuda); "after": the same
tests with them. Writes coverage.{json,md}: per file, statements, lines run before and after, and
every line still unreached, grouped into ranges, with the reason class the report gives for it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "backends/torch_cuda"
TESTS = ["tests/torch_cuda", "tests/torch_cuda_kernels", "tests/methods"]
CUDA_PATHS = "tests/torch_cuda/test_cuda_paths.py"


def measure(tests: list[str], ignore: list[str], data: Path) -> dict[str, dict]:
    """{file: {"statements": [...], "missing": [...]}} for backends/torch_cuda after running `tests`."""
    run = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", f"--include={ROOT / PACKAGE}/*",
           "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *[f"--ignore={path}" for path in ignore]]
    subprocess.run(run, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    report = data.with_suffix(".json")
    subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", str(report)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    files = json.loads(report.read_text())["files"]
    return {str(Path(name).resolve().relative_to(ROOT)): {"statements": info["executed_lines"] + info["missing_lines"],
                                                           "missing": info["missing_lines"]}
            for name, info in files.items()}


def ranges(lines: list[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9"."""
    out, start = [], None
    for i, line in enumerate(sorted(lines)):
        if start is None:
            start = line
        if i + 1 == len(lines) or sorted(lines)[i + 1] != line + 1:
            out.append(str(start) if start == line else f"{start}-{line}")
            start = None
    return ", ".join(out)


def markdown(before: dict, after: dict, machine: str) -> str:
    def total(files: dict) -> tuple[int, int]:
        stmts = sum(len(f["statements"]) for f in files.values())
        return stmts - sum(len(f["missing"]) for f in files.values()), stmts

    (run_b, all_b), (run_a, all_a) = total(before), total(after)
    lines = ["# Line coverage of backends/torch_cuda/ (coverage.py), before and after the simulated-GPU tests", "",
             f"Machine: {machine}. No GPU: the CUDA-only branches run on CPU tensors through "
             "`placement.simulated_cuda` (tests/torch_cuda/simulated_gpu.py); Triton launches are recorded, "
             "their outputs come from the torch twins.", "",
             f"**Before** (torch backend tests without `{CUDA_PATHS}`): {run_b}/{all_b} statements "
             f"({100 * run_b / all_b:.1f}%). **After**: {run_a}/{all_a} ({100 * run_a / all_a:.1f}%).", "",
             "| file | statements | run before | run after | still unreached (lines) |", "|---|---|---|---|---|"]
    for name in sorted(after):
        a, b = after[name], before.get(name, {"statements": after[name]["statements"], "missing": after[name]["statements"]})
        n = len(a["statements"])
        lines.append(f"| {name} | {n} | {n - len(b['missing'])} | {n - len(a['missing'])} | "
                     f"{ranges(a['missing']) or '-'} |")
    lines += ["", "Why lines stay unreached: the Triton kernel bodies (`@triton.jit` functions) run in Triton's "
              "interpreter only when `TRITON_INTERPRET=1` (the interpreter job, not this count) and on a GPU; "
              "the rest are error branches for hardware states a CPU cannot present (a CUDA runtime failing "
              "mid-run, out-of-memory on the device) — read the ranges above against each file."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from specfill.evaluation.machine import describe_machine, machine_line
    with tempfile.TemporaryDirectory() as tmp:
        print("coverage before (without the CUDA-path tests) ...", flush=True)
        before = measure(TESTS, [CUDA_PATHS], Path(tmp) / "before.cov")
        print("coverage after ...", flush=True)
        after = measure(TESTS, [], Path(tmp) / "after.cov")
    machine = machine_line(describe_machine())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coverage.json").write_text(json.dumps({"machine": machine, "tests": TESTS, "cuda_path_tests": CUDA_PATHS,
                                                        "before": before, "after": after}, indent=1) + "\n")
    (args.out / "coverage.md").write_text(markdown(before, after, machine))
    print(args.out / "coverage.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
