"""Where a GPU prefill's time goes: torch.profiler over one run of each method at each length and over
a short plain decode per decode mode (--decode-modes: graphs, eager-static, eager, compiled as in
gpu_bench.py; eager-static shows the static step's kernels one by one, a replayed graph as one launch),
after a warm-up, written as key_averages tables (by operator, and by operator and the Python stack that
launched it: torch records the stacks only with the profiler's verbose experimental config) to
$OUT/profile.md; on CUDA, for a run of at most --waits-max-tokens, also where the host waited on the device
(a third run under torch.cuda.set_sync_debug_mode: each synchronising call counted at the line of ours
that made it). Companion of scripts/gpu_bench.py, for the "why does X fall short of its roofline" question
of a GPU session.

    python scripts/gpu_profile.py --model random:llama-8b --speculator random:llama-1b --tokens 131008,8192 --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile

try:  # the Python stacks of key_averages(group_by_stack_n) are recorded only with verbose on (torch 2.x)
    from torch._C._profiler import _ExperimentalConfig

    STACKS = {"experimental_config": _ExperimentalConfig(verbose=True)}
except ImportError:  # an older torch records them without it
    STACKS = {}
ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import build_method, method_configs, one_run  # noqa: E402
from gpu_bench_report import decode_mode  # noqa: E402

from specfill.api import load, load_speculator  # noqa: E402
from specfill.core.io.random_model import random_prompt_ids  # noqa: E402


def our_line(stack: list[traceback.FrameSummary], root: Path = ROOT) -> str:
    """The innermost frame of `stack` in this checkout (not its virtual environment), as "path:line (function)";
    "(outside the checkout)" where none is."""
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(root) and ".venv" not in path.relative_to(root).parts:
            return f"{path.relative_to(root)}:{frame.lineno} ({frame.name})"
    return "(outside the checkout)"


def waits_table(waits: Counter, rows: int) -> list[str]:
    """The host's waits on the device by the line of ours that made them, most first."""
    lines = ["| synchronising calls | line |", "|---|---|"]
    lines += [f"| {n} | {line} |" for line, n in waits.most_common(rows)]
    return lines if waits else ["(none)"]


@contextmanager
def host_waits() -> Iterator[Counter]:
    """Count every synchronising CUDA call made inside (torch.cuda.set_sync_debug_mode's warnings) by our_line."""
    waits: Counter = Counter()

    def seen(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            waits[our_line(traceback.extract_stack()[:-1])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield waits
        finally:
            torch.cuda.set_sync_debug_mode("default")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:llama-8b")
    p.add_argument("--speculator", default="random:llama-1b")
    p.add_argument("--tokens", default="32768", help="prompt lengths, comma-separated: every method at each")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--decode-prompt", type=int, default=8192)
    p.add_argument("--decode-modes", default="graphs", help="one decode section per mode (comma-separated)")
    p.add_argument("--methods", default="full,h2o,specprefill")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--waits-max-tokens", type=int, default=32768, help="host waits counted up to this prompt length")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.tokens.split(",")]
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "profile.md"
    lines: list[str] = [f"# Profile: {args.model} + {args.speculator}, {args.dtype} on {args.device}\n"]

    def flush() -> None:
        report.write_text("\n".join(lines) + "\n")

    model, tokenizer = load(args.model, dtype=args.dtype, device=args.device, backend="cuda")
    speculator = load_speculator(args.speculator, model, tokenizer, args.dtype, args.device)
    configs = method_configs(compose=True)
    methods = {n: build_method(kind, ns, speculator) for n, (kind, ns) in configs.items()}
    warm = random_prompt_ids(tokenizer.vocab_size, min(5120, *lengths), seed=1)
    for name in args.methods.split(","):
        one_run(model, tokenizer, warm, methods[name], 2)
    scenarios = []
    for n in lengths:
        ids = random_prompt_ids(tokenizer.vocab_size, n, seed=n)
        scenarios += [(name, ids, methods[name], 1, None) for name in args.methods.split(",")]
    decode_ids = random_prompt_ids(tokenizer.vocab_size, min(args.decode_prompt, lengths[0]), seed=7)
    for mode in [m for m in args.decode_modes.split(",") if m]:  # none: ""
        name = f"decode {mode} (full prefill + plain decode)"
        scenarios.append((name, decode_ids, methods["full"], args.decode_tokens, mode))
    for name, prompt, method, new, mode in scenarios:
        if mode is not None:
            decode_mode(model, mode)
        one_run(model, tokenizer, prompt, method, new)  # unprofiled: its caches, kernels and compilation warm
        t0 = time.perf_counter()
        with profile(activities=activities, with_stack=True, record_shapes=False, **STACKS) as prof:
            stats = one_run(model, tokenizer, prompt, method, new)
            if cuda:
                torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        lines.append(f"## {name}, {len(prompt)} tokens, {new} new")
        lines.append(f"profiled wall {wall:.3f} s (profiler overhead included); run stats {stats}\n")
        lines.append("### by operator\n```")
        lines.append(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))
        lines.append("```\n### by operator and Python stack (5 frames)\n```")
        lines.append(
            prof.key_averages(group_by_stack_n=5).table(
                sort_by=sort, row_limit=args.rows, max_name_column_width=50, max_src_column_width=110
            )
        )
        lines.append("```\n")
        if cuda and len(prompt) <= args.waits_max_tokens:
            with host_waits() as waits:
                one_run(model, tokenizer, prompt, method, new)
            lines.append(f"### where the host waited on the device (a third run, {sum(waits.values())} calls)\n")
            lines += waits_table(waits, args.rows) + [""]
        flush()
        print(f"{name}: profiled wall {wall:.3f} s, {stats}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
