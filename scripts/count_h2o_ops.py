"""Count what H2O's phase-2 walk issues per chunk step of one layer on the torch backend's CUDA
path, without a GPU and without timing anything (results/gpu/h2o_walk_ops.md).

CPU tensors take the CUDA branches (placement.simulated_cuda); the two Triton launches of the
phase-2 kernel are replaced by stand-ins that count one launch each and fill the outputs with the
torch twin's result, uncounted (tests/torch_cuda/simulated_gpu.py's fills). Every other aten
operator is counted as torch dispatches it: a "launch" is an operator that is neither a view nor
an allocation (empty*): on a GPU each is at least one kernel launch (a sort is several). A "sync"
is an operator that makes the host wait for the device (.item(), nonzero, boolean-mask indexing,
.tolist(), ...). Stage calls are the H2OOps methods the walk calls. Phase 1 (one intra call per
logical batch) is counted apart: it is not per chunk.

    python scripts/count_h2o_ops.py [--tokens 8192] [--dtype bfloat16] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specfill.backends.torch_cuda import method_ops, placement
from specfill.backends.torch_cuda.kernels import flash_triton
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.config import H2OConfig
from specfill.core.h2o_walk import h2o_attention_layer
from specfill.core.self_check import KERNEL_SELF_CHECK

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: the tests' simulated GPU
from tests.torch_cuda.simulated_gpu import FakeRuntime, _colsum_fill, _forward_fill  # noqa: E402

# operators that wait for the device (their result is read on the host)
SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select", "is_nonzero", "equal"}
SYNC_OPS |= {"unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "bincount", "repeat_interleave"}
# operators that allocate without launching a kernel, and a Python number wrapped as a 0-dim host
# tensor (torch.where(c, x, 0.0)): the kernel takes it as an argument
ALLOC_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "scalar_tensor"}

# the stages the walk calls through its ops (H2OOps)
STAGES = (
    "intra_attention",
    "inter_attention",
    "gather_memory",
    "reduce_colsum_to_kv_heads",
    "accumulate_scores",
    "merge_states",
    "build_memory_set",
    "add_sinks",
    "concat",
    "cast_like",
    "zero_scores",
)


class _Counter(TorchDispatchMode):
    """Counts aten operators by stage; `paused` hides the stand-in launches' own twin work."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = "walk"
        self.paused = False
        self.launches: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func._schema.name.removeprefix("aten::")
            is_view = bool(getattr(func, "is_view", False))
            # an operator that returns no tensor (promote_types, sizes) launches nothing
            no_tensor = not any("Tensor" in str(r.type) for r in func._schema.returns)
            mask_index = name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
            )
            if name in SYNC_OPS or mask_index:
                self.syncs[self.stage] += 1
            if not (is_view or no_tensor) and name not in ALLOC_OPS:
                self.launches[self.stage] += 1
                self.ops[f"{self.stage}:{name}"] += 1
        return func(*args, **(kwargs or {}))


class _FakeLaunch:
    """`kernel[grid](*args, **kwargs)`: one counted launch, outputs filled by the twin, uncounted."""

    def __init__(self, counter: _Counter, fill) -> None:
        self.counter, self.fill = counter, fill

    def __getitem__(self, grid: tuple):
        def launch(*args, **kwargs):
            self.counter.launches[self.counter.stage] += 1
            self.counter.ops[f"{self.counter.stage}:triton:{self.fill.__name__}"] += 1
            self.counter.paused = True
            try:
                self.fill(args, kwargs)
            finally:
                self.counter.paused = False

        return launch


class _CountingOps(TorchOps):
    """TorchOps whose stage calls set the counter's stage and are counted."""

    def __init__(self, counter: _Counter, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counter = counter
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name not in STAGES:
            return attr
        counter, calls = super().__getattribute__("counter"), super().__getattribute__("calls")

        def staged(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            outer, counter.stage = counter.stage, name if counter.stage == "walk" else counter.stage
            try:
                return attr(*args, **kwargs)
            finally:
                counter.stage = outer

        return staged


@contextmanager
def _simulated_gpu(counter: _Counter) -> Iterator[FakeRuntime]:
    saved = flash_triton._forward_kernel, flash_triton._colsum_kernel
    flash_triton._forward_kernel = _FakeLaunch(counter, _forward_fill)
    flash_triton._colsum_kernel = _FakeLaunch(counter, _colsum_fill)
    KERNEL_SELF_CHECK.reset()
    try:
        with placement.simulated_cuda(FakeRuntime((9, 0))) as runtime:  # sm_90, as the H200
            yield runtime
    finally:
        flash_triton._forward_kernel, flash_triton._colsum_kernel = saved
        KERNEL_SELF_CHECK.reset()


def _python_calls(counter: _Counter, run) -> int:
    """Python function calls (frames entered; builtins too) while `run` runs, outside the stand-ins
    and this script: a second run, without the dispatch mode, whose own Python would count."""
    calls = 0

    def hook(frame, event, arg) -> None:
        nonlocal calls
        if event in ("call", "c_call") and not counter.paused and frame.f_code.co_filename != __file__:
            calls += 1

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def count_walk(
    n_tokens: int = 8192,
    n_heads: int = 32,
    n_kv: int = 8,
    head_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    config: H2OConfig | None = None,
) -> dict[str, Any]:
    """One layer's H2O prefill of `n_tokens` on the simulated GPU: per phase-2 chunk step, the
    launches and syncs by stage, the stage calls, and phase 1's launches per logical batch."""
    config = config or H2OConfig(dense_tail=0)  # the tail runs once per prompt, not per chunk
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((n_heads, n_tokens, head_dim), generator=gen).to(dtype)
    k = torch.randn((n_kv, n_tokens, head_dim), generator=gen).to(dtype)
    v = torch.randn((n_kv, n_tokens, head_dim), generator=gen).to(dtype)
    counter = _Counter()
    with ExitStack() as stack:
        runtime = stack.enter_context(_simulated_gpu(counter))
        ops = _CountingOps(counter, torch.device("cpu"), dtype)
        ops.intra_attention(q[:, :64], k[:, :64], v[:, :64], 64, head_dim**-0.5)  # the first-use self-checks
        ops.inter_attention(q[:, :64], k[:, :64], v[:, :64], head_dim**-0.5)
        method_ops.positions(0, n_tokens, q.device)  # steady state: a layer before this one grew the cache
        python_calls = _python_calls(counter, lambda: h2o_attention_layer(ops, q, k, v, config, head_dim**-0.5))
        counter.launches.clear(), counter.syncs.clear(), counter.ops.clear(), ops.calls.clear()
        synced = runtime.synchronized
        with counter:
            h2o_attention_layer(ops, q, k, v, config, head_dim**-0.5)
        synced = runtime.synchronized - synced
    n_chunks = -(-n_tokens // config.chunk_size)
    steps = n_chunks - 1  # phase-2 chunk steps with a memory set (every chunk but the first)
    batches = -(-n_tokens // config.batch_size)
    phase1 = counter.launches.pop("intra_attention", 0)
    walk = {stage: n / steps for stage, n in sorted(counter.launches.items())}
    return {
        "tokens": n_tokens,
        "dtype": str(dtype).removeprefix("torch."),
        "chunk_steps": steps,
        "launches_per_step": sum(walk.values()),
        "launches_per_step_by_stage": walk,
        "syncs_per_step": sum(counter.syncs.values()) / steps + synced / steps,
        "stage_calls_per_step": sum(n for s, n in ops.calls.items() if s != "intra_attention") / steps,
        # the whole layer's Python function calls (phase 1 included; stand-in launches excluded)
        "python_calls_per_step": python_calls / steps,
        "phase1_launches_per_batch": phase1 / batches,
        "ops": dict(sorted(counter.ops.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--heads", type=int, default=32, help="query heads (Llama-3.1-8B's 32)")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=H2OConfig.chunk_size)
    parser.add_argument("--batch-size", type=int, default=H2OConfig.batch_size)
    parser.add_argument("--local", type=int, default=H2OConfig.local)
    parser.add_argument("--heavy", type=int, default=H2OConfig.heavy)
    parser.add_argument("--json", action="store_true", help="print the whole count as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = H2OConfig(
        chunk_size=args.chunk_size, batch_size=args.batch_size, local=args.local, heavy=args.heavy, dense_tail=0
    )
    result = count_walk(args.tokens, args.heads, args.kv_heads, args.head_dim, getattr(torch, args.dtype), config)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['tokens']} tokens, {result['dtype']}, {result['chunk_steps']} phase-2 chunk steps")
    print(f"launches per chunk step: {result['launches_per_step']:.2f}  syncs: {result['syncs_per_step']:.2f}")
    print(f"stage calls per chunk step: {result['stage_calls_per_step']:.2f}")
    print(f"Python calls per chunk step (the layer's): {result['python_calls_per_step']:.0f}")
    for stage, n in result["launches_per_step_by_stage"].items():
        print(f"  {stage:28s} {n:6.2f}")
    print(f"phase 1 launches per logical batch: {result['phase1_launches_per_batch']:.1f}")


if __name__ == "__main__":
    main()
