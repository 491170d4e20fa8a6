"""Load time of a model through specfill's loading path (`specfill.api.load`, one backend), for
the before/after record of input validation (research/loading/results/load_time.md).

    python research/loading/time_load.py --model PATH --label before --out research/loading/results/load_time.json
    python research/loading/time_load.py --report research/loading/results/load_time.json   # -> load_time.md beside it

Each run is one process: a warm-up load (page cache), then --repeats timed loads; the GGUF header
parse (`read_gguf`) is timed on its own too. Run one at a time on a quiet machine.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path



def _seconds(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
        gc.collect()
    return times


def measure(model: str, backend: str, repeats: int) -> dict:
    from evaluation.machine import describe_machine, machine_line
    from specfill.api import load
    try:
        from specfill.core.io.gguf_file import read_gguf
    except ImportError:  # the tree before issue #12 moved the loaders into core/io (for "before" runs)
        from specfill.core.gguf_file import read_gguf

    def header() -> None:
        with read_gguf(model) as gguf_file:
            return len(gguf_file.tensors)

    load(model, backend=backend)  # warm-up: page cache, imports
    header_s = _seconds(header, repeats)
    load_s = _seconds(lambda: load(model, backend=backend), repeats)
    machine = describe_machine()
    return {"model": Path(model).name, "backend": backend, "repeats": repeats,
            "header_median_s": round(statistics.median(header_s), 4),
            "load_median_s": round(statistics.median(load_s), 3), "load_s": [round(t, 3) for t in load_s],
            "machine": machine_line(machine), "cpu_flags_avx512": "avx512f" in Path("/proc/cpuinfo").read_text()}


def report(path: Path) -> Path:
    runs = json.loads(path.read_text())
    lines = ["# Load time before / after input validation (issue #17)", "",
             "`specfill.api.load(path, backend=...)` (weights + tokenizer), median of the timed repeats after a "
             "warm-up load in the same process; `header` is the GGUF header parse alone (`read_gguf`). "
             "`before`: the loader of main 6c47e2a (no validation); `after`: with issue #17's checks "
             "(header and tensor-table validation, typed metadata, the one-token finite-logits check at load). "
             "Torch backend on CPU, float32, one thread; one process at a time.", "",
             "| label | model | backend | header median (s) | load median (s) | loads (s) | machine |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run['label']} | {run['model']} | {run['backend']} | {run['header_median_s']} | "
                     f"{run['load_median_s']} | {', '.join(map(str, run['load_s']))} | {run['machine']} |")
    out = path.with_suffix(".md")
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "load_time.json")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    import torch
    torch.set_num_threads(1)
    run = {"label": args.label, **measure(args.model, args.backend, args.repeats)}
    runs = json.loads(args.out.read_text()) if args.out.is_file() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs + [run], indent=2) + "\n")
    print(json.dumps(run))


if __name__ == "__main__":
    main()
