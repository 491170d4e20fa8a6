"""Start-up of the `specfill` command: wall time and specfill modules loaded, per checkout, interleaved.

    python research/startup/startup_time.py --tree before=/path/to/old/checkout --tree after=. --repeats 3

Each command runs in a fresh interpreter of that checkout's .venv (best of `repeats`, the
checkouts alternating so that load from other jobs hits both alike). Writes
research/startup/results/startup.{json,md} with the machine line and the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from specfill.evaluation.machine import describe_machine, machine_line


COMMANDS = {
    "specfill --help": ["--help"],
    "specfill generate --help": ["generate", "--help"],
    "generate, torch, random:tiny-llama, 2 tokens": ["generate", "--backend", "cuda", "--model", "random:tiny-llama",
                                                      "--prompt", "hi", "--max-tokens", "2"],
    "generate, torch, demo GGUF, 2 tokens": ["generate", "--backend", "cuda", "--prompt", "hi", "--max-tokens", "2"],
    "generate, mlx, demo GGUF, 2 tokens": ["generate", "--backend", "mlx", "--prompt", "hi", "--max-tokens", "2"],
}
# runs the CLI in-process, then reports how many specfill modules it imported
PROBE = ("import sys\nfrom specfill.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print('SPECFILL_MODULES', sum(m.startswith('specfill') for m in sys.modules), file=sys.stderr)")


def run_once(tree: Path, args: list[str]) -> tuple[float, int]:
    """(wall seconds, specfill modules) of one command in a fresh interpreter of `tree`."""
    started = time.perf_counter()
    done = subprocess.run([str(tree / ".venv" / "bin" / "python"), "-c", PROBE, *args], cwd=tree,
                          capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if "SPECFILL_MODULES" not in done.stderr:
        raise SystemExit(f"{tree}: {' '.join(args)} failed: {done.stderr.strip()[-300:]}")
    return seconds, int(done.stderr.rsplit("SPECFILL_MODULES", 1)[1].split()[0])


def measure(trees: dict[str, Path], repeats: int) -> dict[str, dict[str, dict]]:
    """{command: {tree name: {"seconds": best, "modules": n}}}, printing each command's row."""
    table: dict[str, dict[str, dict]] = {}
    for command, args in COMMANDS.items():
        for _ in range(repeats):
            for name, tree in trees.items():
                seconds, modules = run_once(tree, args)
                cell = table.setdefault(command, {}).setdefault(name, {"seconds": seconds, "modules": modules})
                cell["seconds"] = min(cell["seconds"], seconds)
        print(command, {name: (round(c["seconds"], 2), c["modules"]) for name, c in table[command].items()},
              flush=True)
    return table


def write(table: dict, trees: dict[str, Path], repeats: int, loads: tuple[str, str]) -> None:
    machine = describe_machine()
    out = Path(__file__).resolve().parent / "results"
    record = {"machine": machine, "load_before": loads[0], "load_after": loads[1], "repeats": repeats,
              "trees": {name: str(tree) for name, tree in trees.items()}, "commands": table}
    (out / "startup.json").write_text(json.dumps(record, indent=1) + "\n")
    names = list(trees)
    lines = [f"# specfill start-up: wall time and specfill modules per command ({', '.join(names)})", "",
             f"Machine: {machine_line(machine)} (1-, 5-, 15-minute load {loads[0]} at the start, {loads[1]} at the "
             f"end, these runs included; best of {repeats}, checkouts alternating). Made by research/startup/startup_time.py.", "",
             "| command | " + " | ".join(f"{n} s | {n} modules" for n in names) + " |",
             "|---|" + "---|---|" * len(names)]
    for command, cells in table.items():
        lines.append(f"| `{command}` | " + " | ".join(f"{cells[n]['seconds']:.2f} | {cells[n]['modules']}"
                                                     for n in names) + " |")
    (out / "startup.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout with a .venv")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    trees = {name: Path(path).resolve() for name, _, path in (t.partition("=") for t in options.tree)}
    before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    table = measure(trees, options.repeats)
    write(table, trees, options.repeats, (before, " ".join(f"{x:.2f}" for x in os.getloadavg())))


if __name__ == "__main__":
    main()
