"""Where a GPU prefill's time goes: torch.profiler over one run of each method at one length and over
a short plain decode per decode mode (--decode-modes: graphs, eager-static, eager, compiled as in
gpu_bench.py; eager-static shows the static step's kernels one by one, a replayed graph as one launch),
after a warm-up, written as key_averages tables (by operator, and by operator
and the Python stack that launched it) to $OUT/profile.md. Companion of scripts/gpu_bench.py, for the
"why does X fall short of its roofline" question of a GPU session.

    python scripts/gpu_profile.py --model random:llama-8b --speculator random:llama-1b --tokens 32768 --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import build_method, method_configs, one_run  # noqa: E402
from gpu_bench_report import decode_mode  # noqa: E402

from specfill.api import load, load_speculator  # noqa: E402
from specfill.core.io.random_model import random_prompt_ids  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:llama-8b")
    p.add_argument("--speculator", default="random:llama-1b")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--decode-prompt", type=int, default=8192)
    p.add_argument("--decode-modes", default="graphs", help="one decode section per mode (comma-separated)")
    p.add_argument("--methods", default="full,h2o,specprefill")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
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
    warm = random_prompt_ids(tokenizer.vocab_size, min(5120, args.tokens), seed=1)
    for name in args.methods.split(","):
        one_run(model, tokenizer, warm, methods[name], 2)
    ids = random_prompt_ids(tokenizer.vocab_size, args.tokens, seed=args.tokens)
    scenarios = [(name, ids, methods[name], 1, None) for name in args.methods.split(",")]
    decode_ids = random_prompt_ids(tokenizer.vocab_size, min(args.decode_prompt, args.tokens), seed=7)
    for mode in [m for m in args.decode_modes.split(",") if m]:  # none: ""
        name = f"decode {mode} (full prefill + plain decode)"
        scenarios.append((name, decode_ids, methods["full"], args.decode_tokens, mode))
    for name, prompt, method, new, mode in scenarios:
        if mode is not None:
            decode_mode(model, mode)
        one_run(model, tokenizer, prompt, method, new)  # unprofiled: its caches, kernels and compilation warm
        t0 = time.perf_counter()
        with profile(activities=activities, with_stack=True, record_shapes=False) as prof:
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
                sort_by="cpu_time_total", row_limit=args.rows, max_name_column_width=50, max_src_column_width=110
            )
        )
        lines.append("```\n")
        flush()
        print(f"{name}: profiled wall {wall:.3f} s, {stats}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
