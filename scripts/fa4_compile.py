"""Compile FlashAttention-4's forward for a GPU target on this machine, without a GPU (issue 50).

The attention probe's "flash-attn-4" candidate (backends/torch_cuda/attention_choice.py) runs where
FlashAttention-4 is installed; the GPU session carries it (scripts/fa4_pack.sh). This checks ahead of the
GPU that its CuTe DSL compiles, through the candidate's own call, the kernels the probe and the model will
ask for: the model's heads (8B:
32 query / 8 KV heads of 128; its 1B speculator: 32 / 8 of 64), bf16, causal over a step's own keys
(square) and after cached slots (bottom right). The tensors are torch fake tensors (no memory, no
device), which FlashAttention-4 compiles for without launching; FLASH_ATTENTION_ARCH / CUTE_DSL_ARCH
name the target. CuTe DSL checks for a CUDA driver once, before its first load, and raises without one:
that first attempt is repeated. Writes each kernel's cubin size and registers (Triton's bundled cuobjdump;
its shared memory is dynamic, set at launch) as a Markdown table.

    PYVER=3.11 OUT=/tmp/fa4 WITH_CUDA_PYTHON=1 PART_MIB=0 bash scripts/fa4_pack.sh
    mkdir /tmp/fa4site && tar -xJf /tmp/fa4/site-cp311.tar.xz -C /tmp/fa4site
    PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/python_packages \\
        .venv/bin/python scripts/fa4_compile.py --out results/gpu/aot/flash_attn_4.md
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

SHAPES = ((32, 8, 128), (32, 8, 64))  # (query heads, KV heads, head size): the 8B's, its 1B speculator's
STEPS = ((8192, 8192), (8192, 32768))  # (queries, keys): a first step, a step after 3 steps' worth of slots
# q [1, H, T, D] as a layer hands it over, by a token's row length in heads: the rotary-and-store kernel's
# own [1, T, H, D] (a GPU's path), or a view of q and k rotated together, [1, T, H + Hkv, D] (the fallback)
Q_ROWS = (("q compact", 0), ("q in q+k rows", 1))


def _usage(cubin: Path) -> dict[str, int]:
    from triton import knobs

    text = subprocess.run(
        [knobs.nvidia.cuobjdump.path, "-res-usage", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    found = re.findall(r"(REG|SHARED|LOCAL):(\d+)", text.split("Function", 1)[1])
    return {key: int(value) for key, value in found}


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a", help="the CuTe DSL target (FlashAttention-4 reads sm_90)")
    parser.add_argument("--out", type=Path, help="a Markdown table of the compiles (default: stdout only)")
    args = parser.parse_args()
    dump = Path(tempfile.mkdtemp(prefix="fa4-cubins."))
    os.environ.update(
        FLASH_ATTENTION_ARCH=args.arch.rstrip("a"), CUTE_DSL_ARCH=args.arch,
        CUTE_DSL_KEEP_CUBIN="1", CUTE_DSL_DUMP_DIR=str(dump),
    )  # fmt: skip
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from specfill.backends.torch_cuda import attention_choice as choice

    rows, failures = [], 0
    cells = [(shape, step, q_rows) for shape in SHAPES for q_rows in Q_ROWS for step in STEPS]
    for (heads, kv_heads, head_dim), (queries, keys), (q_name, with_keys) in cells:
        label = f"{heads}/{kv_heads}x{head_dim} bf16, {queries} queries over {keys} keys, causal, {q_name}"
        began, wall = time.perf_counter(), time.time()
        for attempt in (1, 2):  # the DSL's one-time driver check fails the first compile on a machine without one
            try:
                with FakeTensorMode(allow_non_fake_inputs=True), torch.inference_mode():
                    # as a layer hands them over: q a [1, H, T, D] view (Q_ROWS), keys and values the
                    # filled slots of a [1, Hkv, capacity, D] cache
                    # (strided fakes: slicing a fake CUDA tensor needs a CUDA build of torch)
                    dtype, d, row = torch.bfloat16, head_dim, (heads + with_keys * kv_heads) * head_dim
                    q = torch.empty_strided(
                        (1, heads, queries, d), (queries * row, d, row, 1), dtype=dtype, device="cuda"
                    )
                    slots = (kv_heads * (keys + 1024) * d, (keys + 1024) * d, d, 1)
                    k, v = (
                        torch.empty_strided((1, kv_heads, keys, d), slots, dtype=dtype, device="cuda") for _ in "kv"
                    )
                    out = choice._flash_attn_4(q, k, v, keys - queries, None)
                assert tuple(out.shape) == (1, heads, queries, head_dim), out.shape
                error = None
                break
            except Exception as e:  # noqa: BLE001 - the compiler's error is the finding
                error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
                if "Driver" not in str(e) or attempt == 2:
                    break
        seconds = time.perf_counter() - began
        # a new kernel's cubin (named by a truncated signature: a later kernel's may overwrite it)
        new = [p for _, p in sorted((p.stat().st_mtime, p) for p in dump.glob("*.cubin") if p.stat().st_mtime >= wall)]
        if error is None:
            usage = _usage(new[-1]) if new else {}
            cubin = f"{new[-1].stat().st_size // 1024} KB" if new else "cached (same kernel as above)"
            rows.append(f"| {label} | compiled | {seconds:.1f} | {cubin} | {usage.get('REG', '-')} |")
        else:
            failures += 1
            rows.append(f"| {label} | {error} | {seconds:.1f} | - | - |")
        print(rows[-1], flush=True)
    meta = (
        f"flash-attn-4 {version('flash-attn-4')} (nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}) for "
        f"{args.arch}, torch {torch.__version__}, Python "
        f"{platform.python_version()}, on {_cpu()} without a GPU, {time.strftime('%Y-%m-%d')}"
    )
    table = [
        "| kernel asked | result | seconds | cubin | registers |",
        "|---|---|---|---|---|",
        *rows,
    ]
    if args.out:
        why = (
            'The attention probe\'s "flash-attn-4" candidate (backends/torch_cuda/attention_choice.py) compiled '
            "through its own call for the shapes a Llama-3.1-8B prefill and its Llama-3.2-1B speculator ask, "
            "with torch fake tensors laid out as a layer hands them over (q as the rotary-and-store kernel "
            "writes it, and as a view of q and k rotated together; keys and values the filled slots of a larger "
            'cache): `scripts/fa4_compile.py`, whose docstring has the commands. A row "cached" reuses the '
            "kernel above it (the kernels take sequence lengths at run time). Whether it is faster than cuDNN on "
            "an H200 is the GPU session's probe to say."
        )
        args.out.write_text(
            "\n".join([f"# FlashAttention-4 compiled ahead of the GPU ({meta})", "", why, "", *table, ""])
        )
    print(meta)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
