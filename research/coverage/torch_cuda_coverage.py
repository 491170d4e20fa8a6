"""Line coverage of backends/torch_cuda/ before and after the simulated-GPU tests (issue 22, item 2).

    .venv/bin/pip install coverage      # a measurement tool, not a dependency of specfill
    .venv/bin/python research/coverage/torch_cuda_coverage.py [--out results/gpu]

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

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "backends/torch_cuda"
TESTS = ["tests/torch_cuda", "tests/torch_cuda_kernels", "tests/adapters", "tests/methods"]
CUDA_PATHS = "tests/torch_cuda/test_cuda_paths.py"


def measure(tests: list[str], ignore: list[str], data: Path) -> dict[str, dict]:
    """{file: {"statements": [...], "missing": [...]}} for backends/torch_cuda after running `tests`."""
    run = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", f"--source={ROOT / PACKAGE}",
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


def markdown(before: dict, after: dict, machine: str, commit: str) -> str:
    def total(files: dict) -> tuple[int, int]:
        stmts = sum(len(f["statements"]) for f in files.values())
        return stmts - sum(len(f["missing"]) for f in files.values()), stmts

    before = {name: before.get(name, {"statements": f["statements"], "missing": f["statements"]})
              for name, f in after.items()}  # a file no test imported: every statement unreached
    (run_b, all_b), (run_a, all_a) = total(before), total(after)
    lines = ["# Line coverage of backends/torch_cuda/ (coverage.py), before and after the simulated-GPU tests", "",
             f"Measured at commit {commit} (file names and line numbers are that commit's).", "",
             f"Machine: {machine}. No GPU: the CUDA-only branches run on CPU tensors through "
             "`placement.simulated_cuda` (tests/torch_cuda/simulated_gpu.py); Triton launches are recorded, "
             "their outputs come from the torch twins.", "",
             f"**Before** (torch backend tests without `{CUDA_PATHS}`): {run_b}/{all_b} statements "
             f"({100 * run_b / all_b:.1f}%). **After**: {run_a}/{all_a} ({100 * run_a / all_a:.1f}%).", "",
             "| file | statements | run before | run after | still unreached (lines) |", "|---|---|---|---|---|"]
    for name in sorted(after):
        a, b = after[name], before[name]
        n = len(a["statements"])
        lines.append(f"| {name} | {n} | {n - len(b['missing'])} | {n - len(a['missing'])} | "
                     f"{ranges(a['missing']) or '-'} |")
    lines += ["", "Why lines stay unreached, by kind:", "",
              "- **The CUDA runtime itself** (placement.py's CudaRuntime: `torch.cuda.get_device_properties`, "
              "capability, synchronize, `max_memory_allocated`): the seam the tests use stands in for exactly "
              "these calls; only a GPU answers them.",
              "- **Triton kernel bodies** (`@triton.jit` functions in flash_triton.py and scoring_triton.py): they "
              "run in Triton's interpreter (`TRITON_INTERPRET=1`, a separate CI job, not this count) and on a GPU; "
              "here their launches are recorded and the outputs come from the torch twins.",
              "- **Ahead-of-time compilation** (kernels/aot.py's compile and report path): it runs in a "
              "subprocess (Triton must decorate the kernels with TRITON_INTERPRET unset), which coverage.py does "
              "not follow: tests/torch_cuda_kernels/test_aot.py compiles 4 cells for sm_89, "
              "scripts/aot_matrix.py the whole matrix.",
              "- **Argument checks and empty inputs** (intra.py, scoring.py, dispatch.py: wrong ranks, mismatched "
              "heads, zero queries or keys, Triton not installed): reachable on the CPU, not by these test "
              "files (the conformance and hostile-input suites exercise the public entry points instead).",
              "- **Paths no torch-backend test takes** (a few cache helpers, one fallback when "
              "torch lacks its CPU flash op): CPU code, listed so they are not mistaken for GPU-only lines."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    from specfill.evaluation.machine import describe_machine, machine_line
    with tempfile.TemporaryDirectory() as tmp:
        print("coverage before (without the CUDA-path tests) ...", flush=True)
        before = measure(TESTS, [CUDA_PATHS], Path(tmp) / "before.cov")
        print("coverage after ...", flush=True)
        after = measure(TESTS, [], Path(tmp) / "after.cov")
    machine = machine_line(describe_machine())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coverage.json").write_text(json.dumps({"machine": machine, "tests": TESTS, "cuda_path_tests": CUDA_PATHS,
                                                        "commit": commit, "before": before, "after": after}, indent=1) + "\n")
    (args.out / "coverage.md").write_text(markdown(before, after, machine, commit))
    print(args.out / "coverage.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
