"""This machine's sustained GEMM, attention and memory rates, for the roofline (evaluation/roofline.py).

Measured on the shapes a prefill runs: a [step, hidden] x [hidden, ffn] GEMM (the FFN's widest
matrix), causal attention of `context` queries over themselves with the model's heads (torch:
SDPA, the backend's first prefill step; MLX: mx.fast.scaled_dot_product_attention), and a large
copy for bandwidth. Best of `repeats` after one warm-up: these are the rates the machine reaches,
and on a machine shared with other work the best run is the least disturbed one.
"""

from __future__ import annotations

import time
from typing import Callable

from .roofline import Rates, Shape


def _best(run: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    run()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def _counts(shape: Shape, step: int, context: int) -> tuple[float, float]:
    """FLOPs of the GEMM and of the causal attention that are timed."""
    pairs = context * (context + 1) // 2
    return 2.0 * step * shape.hidden * shape.ffn, 4.0 * shape.head_dim * shape.heads * pairs


def torch_rates(
    shape: Shape, device: str = "cpu", dtype: str = "float32", step: int = 2048, context: int = 4096, repeats: int = 3
) -> Rates:
    """Rates of torch on `device` (cpu or cuda) at `dtype`."""
    import torch
    import torch.nn.functional as F

    from specfill.backends import get_backend

    dev, kind = torch.device(device), getattr(torch, dtype)
    backend = get_backend("cuda")

    def sync() -> None:
        backend.synchronize(dev)

    gen = torch.Generator().manual_seed(0)
    x, w = (torch.randn(s, generator=gen).to(dev, kind) for s in ((step, shape.hidden), (shape.hidden, shape.ffn)))
    q = torch.randn((1, shape.heads, context, shape.head_dim), generator=gen).to(dev, kind)
    k, v = (torch.randn((1, shape.kv_heads, context, shape.head_dim), generator=gen).to(dev, kind) for _ in "kv")
    big, into = (torch.ones(64 * 2**20, dtype=torch.float32, device=dev) for _ in "ab")
    gemm_flops, attn_flops = _counts(shape, step, context)
    with torch.inference_mode():
        gemm = _best(lambda: x @ w, sync, repeats)
        attention = _best(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=shape.heads != shape.kv_heads),
            sync,
            repeats,
        )
        copy = _best(lambda: into.copy_(big), sync, repeats)
    return Rates(
        f"torch {device} {dtype} {torch.get_num_threads()} threads",
        gemm_flops / gemm,
        attn_flops / attention,
        2 * big.numel() * 4 / copy,
        f"measured: {shape.name} GEMM [{step}x{shape.hidden}]x[{shape.hidden}x{shape.ffn}], "
        f"causal SDPA over {context} tokens, 256 MB copy into place; best of {repeats}",
    )


def mlx_rates(shape: Shape, dtype: str = "float32", step: int = 2048, context: int = 4096, repeats: int = 3) -> Rates:
    """Rates of MLX on its default device (Metal on a Mac, the CPU elsewhere)."""
    import mlx.core as mx

    kind = getattr(mx, dtype)
    mx.random.seed(0)
    x, w = mx.random.normal((step, shape.hidden)).astype(kind), mx.random.normal((shape.hidden, shape.ffn)).astype(kind)
    q = mx.random.normal((1, shape.heads, context, shape.head_dim)).astype(kind)
    k, v = (mx.random.normal((1, shape.kv_heads, context, shape.head_dim)).astype(kind) for _ in "kv")
    big = mx.ones((64 * 2**20,), dtype=mx.float32)
    mx.eval(x, w, q, k, v, big)
    out: list = []

    def run(fn: Callable[[], object]) -> Callable[[], None]:
        return lambda: out.append(mx.eval(fn()))

    gemm_flops, attn_flops = _counts(shape, step, context)
    scale = shape.head_dim**-0.5
    gemm = _best(run(lambda: x @ w), lambda: None, repeats)
    attention = _best(
        run(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")), lambda: None, repeats
    )
    copy = _best(run(lambda: big + 1.0), lambda: None, repeats)
    return Rates(
        f"mlx {mx.default_device()} {dtype}",
        gemm_flops / gemm,
        attn_flops / attention,
        2 * big.size * 4 / copy,
        f"measured: {shape.name} GEMM [{step}x{shape.hidden}]x[{shape.hidden}x{shape.ffn}], "
        f"causal SDPA over {context} tokens, 256 MB read + write; best of {repeats}",
    )
