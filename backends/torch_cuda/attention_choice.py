"""The fused attention a CUDA device runs for prefill, chosen once per device and shape.

torch offers several fused kernels (FlashAttention-2, cuDNN's, memory-efficient) behind
scaled_dot_product_attention, and which one is fastest, and which takes grouped KV heads without
expanded copies, depends on the GPU and the torch build; our Triton kernel (kernels/prefill_triton.py:
one call for either kind, grouped heads read in place) is a candidate of both kinds wherever Triton is
installed and the kernels are not turned off, and so is FlashAttention-4 (flash_attn.cute, the FA3 design
on Hopper) wherever it is installed; so is cuDNN's split call with our one-pass merge
(kernels/merge_triton.py) beside torch's. A prefill step needs two kinds of call:

- "causal": a step over an empty cache (its own keys are all keys; square causal);
- "prefix": a step after `start` cached slots, query t seeing slots 0..start + t (lower-right
  causal), which torch's dispatcher sends to the flash kernel only, and only with KV heads
  expanded unless `enable_gqa` is passed (the expansion cost ~10% of a 32K prefill on an H200).

- "decode": a decode step's few query rows per KV head (grouped heads folded into rows) over the
  cache's slot bucket with the step's additive mask (decode_graph.py), where SDPA launches one
  program per KV head; the Triton split-key kernel (kernels/decode_triton.py) spreads the cache
  over KV heads x splits programs and merges them by their float32 maxima.

For each kind (and a "prefix" call's span of keys) a few candidates are tried once on a representative
shape (the model's heads and head size, the call's dtype) laid out as the call's own tensors are (`layout`:
q as the layer's rotation wrote it, a compact [1, T, H, D] or a view of q and k rotated together; keys and
values the filled slots of a larger cache: a kernel that mishandles a stride or a descriptor's alignment
fails or errs in the probe, not in a request): a candidate that raises or whose output differs from a
float32 reference by more than the dtype's tolerance is dropped; the fastest of the rest is kept for the
process and that layout (`chosen()` reports them; bench and the GPU session record it), and on disk for the
next process on the same GPU and software (probe_store.py: there the kept choice is probed alone, its check
and timing, and the rest only if it fails). Off CUDA nothing is probed: CPU calls keep attention.py's paths.

Tolerance: bf16 / fp16 outputs of fused kernels differ from a float32 reference by their
rounding of softmax weights and outputs (~4e-3 relative measured on bf16 rows of unit-scale
data); 3e-2 absolute on unit-scale values (bf16) and 5e-3 (fp16) catch a wrong mask or a wrong
head grouping, whose errors are O(0.1-1). float32: 1e-4 (TF32 is off for these calls by default).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.nn.functional as F

from specfill.core.methods.h2o import full_dot_products
from specfill.core.self_check import kernels_setting

from . import placement, probe_store
from .tensor_layout import Layout, label_layouts, laid_out, layout

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "float | None"], torch.Tensor]

PROBE_QUERIES = 2048  # a prefill step's queries (the library's step size), the fewest the probe takes
PROBE_MAX_QUERIES = 8192  # the most: a GPU's 16K steps are probed at 8K (the float32 reference's memory)
PROBE_PREFIX = 6144  # cached slots before the step in the "prefix" probe (3 steps' worth)
# A "prefix" step's kernel is chosen per span of its keys (up to 16K slots, up to 64K, beyond), each probed on
# slots of its own: a 2K-query step after 6K slots ranks kernels otherwise than a 16K step after 112K (the H200's
# 1B speculator, 2026-12-04, ran 128K prompts on a choice probed at 2,048 queries after 6,144 slots).
PREFIX_SPANS = (16_384, 65_536)
SPAN_SLOTS = (0, 40_960, 98_304)  # the slots a span's probe runs over (0: four times its queries, as before)


# A "causal" step's kernel likewise per size of the step: up to 4K queries (probed at the call's, at least
# PROBE_QUERIES), more (probed at PROBE_MAX_QUERIES, whatever the first call's size). Before, the first call
# chose for every size: the H200 bench's 5,120-token warm-up chose the kernel of the 8B's 16K first steps, and a
# user's first short prompt would choose it for every later long one (the choice is kept on disk).
CAUSAL_SPANS = (4096,)
SPANS = {"prefix": (PREFIX_SPANS, "keys"), "causal": (CAUSAL_SPANS, "queries")}  # a kind's span edges, by what


def call_span(kind: str, queries: int, slots: int) -> int:
    """The span a call of `kind` with `queries` queries over `slots` keys is probed and chosen in: a
    "prefix" call's by its keys, a "causal" call's by its queries (SPANS; 0 below the first edge)."""
    edges, by = SPANS.get(kind, ((), ""))
    return sum((slots if by == "keys" else queries) > edge for edge in edges)


def _span_label(kind: str, span: int) -> str:
    """chosen()'s words for a span past the first: " over 64K keys", " over 4K queries"."""
    edges, by = SPANS.get(kind, ((), ""))
    return f" over {edges[span - 1] // 1024}K {by}" if span else ""


PROBE_REPEATS = 3
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _expand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    group = q.shape[1] // k.shape[1]
    return (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)) if group > 1 else (k, v)


def _sdpa_causal(backend: Any) -> Kernel:
    """Square causal through torch's dispatcher, grouped heads passed through; `backend` forces one."""

    def run(q, k, v, start, scale):
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([backend]) if backend is not None else nullcontext():
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
            )

    return run


def _lower_right(gqa: bool) -> Kernel:
    """torch's lower-right causal bias (flash or memory-efficient); KV heads expanded unless gqa."""

    def run(q, k, v, start, scale):
        from torch.nn.attention.bias import causal_lower_right

        if not gqa:
            k, v = _expand(q, k, v)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
            scale=scale,
            enable_gqa=gqa and q.shape[1] != k.shape[1],
        )

    return run


def _flash_raw(q, k, v, causal, scale):
    return tuple(torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2])


def _cudnn_raw(q, k, v, causal, scale):
    attention = torch.ops.aten._scaled_dot_product_cudnn_attention
    return tuple(attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2])


Merge = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _torch_merge(out_p: torch.Tensor, out_c: torch.Tensor, lse_p: torch.Tensor, lse_c: torch.Tensor) -> torch.Tensor:
    """Two halves [1, Hq, T, D] merged by their float32 log-sum-exps [1, Hq, T], in float32."""
    lse = torch.logaddexp(lse_p, lse_c)  # float32 softmax statistics [1, Hq, T]
    merged = out_p.float() * torch.exp(lse_p - lse)[..., None] + out_c.float() * torch.exp(lse_c - lse)[..., None]
    return merged.to(out_p.dtype)


def _triton_merge(out_p: torch.Tensor, out_c: torch.Tensor, lse_p: torch.Tensor, lse_c: torch.Tensor) -> torch.Tensor:
    """The same merge in one launch (kernels/merge_triton.py: one pass, float32 weights; torch's is ~7
    float32 kernels over the halves, ~15% of the split candidate's time at the probe's shape)."""
    from .kernels.dispatch import triton_kernel

    return triton_kernel("lse_merge")(out_p, out_c, lse_p, lse_c)


def _split(raw: Callable[..., tuple[torch.Tensor, torch.Tensor]], merge: Merge = _torch_merge) -> Kernel:
    """Two fused calls merged by their log-sum-exp: unmasked over the prefix, causal over the step's
    own keys (square, so top-left and lower-right agree): no mask, no expanded heads."""

    def run(q, k, v, start, scale):
        out_p, lse_p = raw(q, k[:, :, :start], v[:, :, :start], False, scale)
        out_c, lse_c = raw(q, k[:, :, start:], v[:, :, start:], True, scale)
        lse_p, lse_c = lse_p.reshape(out_p.shape[:3]).float(), lse_c.reshape(out_c.shape[:3]).float()
        return merge(out_p, out_c, lse_p, lse_c)

    return run


def _triton_variant(**options: bool) -> Kernel:
    """kernels/prefill_triton.py: one call, lower-right causal, grouped heads by pointer arithmetic; with
    tma=True through tensor descriptors (sm_90 and later), with wide=True too on 128 x 128 tiles
    (tiles.prefill_tiles' wide ones, sm_90's 16-bit heads up to 128)."""

    def run(q, k, v, start, scale):
        from .kernels.dispatch import triton_kernel

        if start != k.shape[2] - q.shape[2]:
            raise ValueError(f"the Triton prefill kernel takes the step's queries last (start {start})")
        return triton_kernel("prefill_attention")(q, k, v, scale, **options)

    return run


_triton_prefill, _triton_prefill_tma = _triton_variant(), _triton_variant(tma=True)
_triton_prefill_tma_wide = _triton_variant(tma=True, wide=True)


def _flash_attn_4(q, k, v, start, scale):
    """FlashAttention-4's forward (`pip install flash-attn-4`: CuTe DSL kernels, on sm_90 the FA3 design,
    warp-specialised producer and consumer warpgroups, which torch's own kernels lack): one call for
    either kind, causal aligned to the bottom right (query t sees slots 0..S - T + t), grouped heads
    passed through, on [1, T, H, D] views of q, k and v (no copies: the layer's projections and the
    cache keep the head size contiguous); bf16 / fp16 only. Compiled on first use (seconds a shape)."""
    from flash_attn.cute.interface import flash_attn_func

    if start != k.shape[2] - q.shape[2]:
        raise ValueError(f"FlashAttention-4 takes the step's queries last (start {start})")
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=True)
    return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)


def _flash_attn_4_installed() -> bool:
    """FlashAttention-4's CuTe package importable (flash_attn.cute; FlashAttention-2's flash_attn has none)."""
    import importlib.util

    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except Exception:  # a flash_attn package that cannot import (a broken build, another torch's): no candidate
        return False


def _triton_wanted() -> bool:
    """Whether the Triton prefill kernel is a candidate: Triton installed and kernels not turned
    off (SPECFILL_KERNELS=off / --kernels off keeps every call on torch's own kernels)."""
    from .kernels.dispatch import triton_installed

    return triton_installed() and kernels_setting(None) is not False


def _tma_capable() -> bool:
    """Whether the GPU reads tensor descriptors with its copy engine (sm_90 and later): only there is
    the TMA variant worth its compile in the probe."""
    if not placement.RUNTIME.available():
        return False
    return placement.RUNTIME.capability(torch.device("cuda"))[0] >= 9


def candidates(kind: str) -> dict[str, Kernel]:
    """The candidates of `kind`: torch's fused kernels, ours (kernels not off), and FlashAttention-4
    where it is installed (kernels not off: the setting keeps every call on torch's own)."""
    from torch.nn.attention import SDPBackend

    extra = {"triton": _triton_prefill} if _triton_wanted() else {}
    if extra and kind == "prefix":
        extra["split-cudnn-triton-merge"] = _split(_cudnn_raw, _triton_merge)
    if extra and _tma_capable():
        extra["triton-tma"] = _triton_prefill_tma
        extra["triton-tma-wide"] = _triton_prefill_tma_wide
    if kernels_setting(None) is not False and _flash_attn_4_installed():
        extra["flash-attn-4"] = _flash_attn_4
    if kind == "causal":
        return {
            "sdpa": _sdpa_causal(None),
            "flash": _sdpa_causal(SDPBackend.FLASH_ATTENTION),
            "cudnn": _sdpa_causal(SDPBackend.CUDNN_ATTENTION),
            **extra,
        }
    return {
        "lower-right-expanded": _lower_right(gqa=False),
        "lower-right-gqa": _lower_right(gqa=True),
        "split-flash": _split(_flash_raw),
        "split-cudnn": _split(_cudnn_raw),
        **extra,
    }


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float | None, block: int = 1024
) -> torch.Tensor:
    """float32 attention with an explicit lower-right causal mask, one KV head's query heads and `block`
    queries at a time (a long span's probe, 8K queries over 98K slots, is ~100 GB of float32 scores whole)."""
    group, steps, attend = q.shape[1] // k.shape[1], q.shape[2], F.scaled_dot_product_attention
    out = torch.empty((*q.shape[:3], v.shape[-1]), dtype=torch.float32, device=q.device)
    slots = torch.arange(k.shape[2], device=q.device)[None, :]
    for h in range(k.shape[1]):
        heads = slice(h * group, (h + 1) * group)
        kh, vh = (x[:, h : h + 1].float().expand(1, group, -1, -1) for x in (k, v))
        for first in range(0, steps, block):
            rows = torch.arange(first, min(first + block, steps), device=q.device)[:, None]
            part = q[:, heads, first : first + block].float()
            out[:, heads, first : first + block] = attend(part, kh, vh, attn_mask=slots <= start + rows, scale=scale)
    return out


DecodeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
PROBE_SLOTS = 8192  # the decode probe's bucket: an 8K context
PROBE_HIDDEN = 100  # its last slots masked, as a bucket's unfilled slots are


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hkv, R, D] (folded rows), k [Hkv, N, D], v [Hkv, N, Dv], additive bias [R, N] -> [Hkv, R, Dv]:
    one masked SDPA call (a program per KV head on CUDA)."""
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=bias[None, None], scale=scale)[0]


def split_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """The Triton split-key kernel (kernels/decode_triton.py), the same arguments as sdpa_decode."""
    from .kernels.dispatch import triton_kernel

    return triton_kernel("decode_attention")(q, k, v, bias, scale)


DECODE_KERNELS: dict[str, DecodeKernel] = {"sdpa": sdpa_decode, "split-triton": split_decode}


def decode_candidates() -> dict[str, DecodeKernel]:
    """The decode kind's candidates: SDPA, and the split-key Triton kernel unless Triton is missing or the
    kernels are turned off (--kernels off keeps decoding on torch's own kernels, as prefill)."""
    return DECODE_KERNELS if _triton_wanted() else {"sdpa": sdpa_decode}


def probe_decode(
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    kernels: dict[str, DecodeKernel] | None = None,
    slots: int = PROBE_SLOTS,
    layouts: tuple[Layout, Layout, Layout] | None = None,
) -> tuple[str, DecodeKernel, dict[str, str]]:
    """probe's decode kind: one token's G = heads / kv_heads rows per KV head over `slots` keys,
    the last PROBE_HIDDEN masked, q, k and v in `layouts` (None: contiguous); the fastest correct
    candidate against float32 SDPA."""
    kernels = decode_candidates() if kernels is None else kernels
    gen = torch.Generator(device=device).manual_seed(0)
    rows = heads // kv_heads
    shapes = ((kv_heads, rows, head_dim), (kv_heads, slots, head_dim), (kv_heads, slots, head_dim))
    families = layouts or (None, None, None)
    q, k, v = (laid_out(family, shape, gen, dtype, device) for family, shape in zip(families, shapes))
    seen = torch.arange(slots, device=device) < slots - min(PROBE_HIDDEN, slots - 1)
    bias = torch.zeros((rows, slots), dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
    scale = head_dim**-0.5
    expected = sdpa_decode(q.float(), k.float(), v.float(), bias.float(), scale)
    return _fastest(kernels, lambda kernel: kernel(q, k, v, bias, scale), expected, dtype, device, "decode")


def decode_kernel(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> DecodeKernel:
    """The decode attention `name` asks for ("sdpa", "split-triton"), or with "auto" the one
    probed fastest for q [Hkv, R, D] / k [Hkv, N, D]'s rows (Hkv x R: the query heads times the
    step's tokens, as chosen() names them), head size, dtype and CUDA device (probed at the first
    call with that key, which must not be inside a CUDA graph capture or a
    compiled function: decode_graph.py runs every step eagerly once first), probed in the layouts of q,
    k and v (v: k's where not given); off CUDA, sdpa."""
    if name != "auto":
        return DECODE_KERNELS[name]
    if q.device.type != "cuda":
        return sdpa_decode
    layouts = (layout(q), layout(k), layout(k if v is None else v))
    rows = q.shape[0] * q.shape[1]
    key = ("decode", rows, k.shape[0], q.shape[2], q.dtype, q.device, layouts, 0)
    if key not in _CHOSEN:
        run = lambda kernels: probe_decode(rows, k.shape[0], q.shape[2], q.dtype, q.device, kernels, layouts=layouts)  # noqa: E731
        _CHOSEN[key] = probe_store.remembered(key, q.device, run, decode_candidates)
    return _CHOSEN[key][1]


def grouped_decode(
    name: str, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [1, Hq, T, D] of a decode or verify step over keys / values [1, Hkv, S, D] with the additive bias
    [G * T, S] -> [1, Hq, T, Dv]: grouped heads folded into rows (row g * T + t: head (kv, g), query t; no KV
    head copied) and the decode attention `name` (decode_kernel). The one call of a static decode step and,
    on a GPU, of an eager one (attention.one_query_cuda), so that both compute the same attention."""
    _, n_heads, steps, dim = q.shape
    n_kv = keys.shape[1]
    folded = q.reshape(n_kv, n_heads // n_kv * steps, dim)
    out = decode_kernel(name, folded, keys[0], values[0])(folded, keys[0], values[0], bias, scale)
    return out.reshape(1, n_heads, steps, values.shape[-1])


def _timed(run: Callable[[], torch.Tensor], device: torch.device) -> float:
    run()
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - began)
    return best


_CHOSEN: dict[tuple, tuple[str, Kernel, dict[str, str]]] = {}  # key -> (name, kernel, the probe's report)


def probe(
    kind: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    kernels: dict[str, Kernel] | None = None,
    queries: int = PROBE_QUERIES,
    prefix: int = PROBE_PREFIX,
    layouts: tuple[Layout, Layout, Layout] | None = None,
) -> tuple[str, Kernel, dict[str, str]]:
    """Try every candidate of `kind` on random unit-scale data of this shape, q, k and v in `layouts`
    (None: contiguous): (name, kernel) of the fastest correct one and a report {name: "1.23 ms" |
    "wrong: ..." | "failed: ...", "probed on": "2048 queries after 6144 slots", "rate": "512 TFLOP/s"
    (the chosen kernel's, probe_flops)}."""
    kernels = candidates(kind) if kernels is None else kernels
    gen = torch.Generator(device=device).manual_seed(0)
    start = 0 if kind == "causal" else prefix
    shapes = ((1, heads, queries, head_dim), (1, kv_heads, start + queries, head_dim))
    families = layouts or (None, None, None)
    q, k, v = (laid_out(family, shape, gen, dtype, device) for family, shape in zip(families, (*shapes, shapes[1])))
    expected = reference(q, k, v, start, None)
    flops = probe_flops(heads, head_dim, queries, start)
    call = lambda kernel: kernel(q, k, v, start, None)  # noqa: E731
    name, kernel, report = _fastest(kernels, call, expected, dtype, device, kind, flops)
    report["probed on"] = f"{queries} queries after {start} slots"
    return name, kernel, report


def probe_flops(heads: int, head_dim: int, queries: int, start: int) -> float:
    """FLOPs of a probe's call: q.k and p.v (2 x 2 x head_dim a pair) of every query head's visible pairs,
    query t seeing slots 0..start + t (the causal half only, as the roofline counts them). Over the chosen
    kernel's time, the probe's "rate": how near its head size's kernels come to the GPU's peak (a 1B
    speculator's head of 64 against the 8B's 128 on one GPU, issue #50's SpecPrefill line)."""
    return 4.0 * heads * head_dim * (queries * start + full_dot_products(queries))


def _fastest(
    kernels: dict[str, Any],
    call: Callable[[Any], torch.Tensor],
    expected: torch.Tensor,
    dtype,
    device,
    kind: str,
    flops: float | None = None,
) -> tuple[str, Any, dict[str, str]]:
    """(name, kernel) of the fastest candidate whose call(kernel) is within the dtype's tolerance
    of `expected`, and the report {name: "1.23 ms" | "wrong: ..." | "failed: ..."}, with the chosen
    one's "rate" ("512 TFLOP/s") where the call's `flops` are given."""
    tolerance = TOLERANCE.get(dtype, 3e-2)
    report: dict[str, str] = {}
    best: tuple[float, str, Any] | None = None
    for name, kernel in kernels.items():
        try:
            error = float((call(kernel).float() - expected).abs().max())
            if not error <= tolerance:
                report[name] = f"wrong: max error {error:.3g} > {tolerance:g}"
                continue
            seconds = _timed(lambda: call(kernel), device)
        except Exception as e:  # not built for this GPU / dtype / head size: the next candidate
            report[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            continue
        report[name] = f"{seconds * 1e3:.3f} ms"
        if best is None or seconds < best[0]:
            best = (seconds, name, kernel)
    if best is None:
        raise RuntimeError(f"no {kind} attention kernel works here: {report}")
    if flops is not None:
        report["rate"] = f"{flops / best[0] / 1e12:.0f} TFLOP/s"
    return best[1], best[2], report


def kernel_for(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> Kernel:
    """The chosen kernel of `kind` for q [1, Hq, T, D] / k [1, Hkv, S, D]'s heads, head size,
    dtype and device; probed at the first call with that key, on steps of that call's T queries
    held between PROBE_QUERIES and PROBE_MAX_QUERIES (a prompt's first step is the model's step
    size unless the prompt is shorter), for "prefix" after three steps' worth of cached slots or, for a
    call over more than 16K keys, up to its span's SPAN_SLOTS; a "causal" call of more than 4K queries on
    PROBE_MAX_QUERIES (each span probed apart: call_span), q, k and v laid out as the call's (`layout`; v:
    k's where not given): a call in another layout is probed apart."""
    layouts = (layout(q), layout(k), layout(k if v is None else v))
    span = call_span(kind, q.shape[2], k.shape[2])
    key = (kind, q.shape[1], k.shape[1], q.shape[3], q.dtype, q.device, layouts, span)
    if key not in _CHOSEN:
        wide = kind == "causal" and span > 0  # a causal step past 4K queries: probed at the most
        queries = PROBE_MAX_QUERIES if wide else min(max(q.shape[2], PROBE_QUERIES), PROBE_MAX_QUERIES)
        prefix = SPAN_SLOTS[span] - queries if kind == "prefix" and SPAN_SLOTS[span] else 3 * queries
        shape = (q.shape[1], k.shape[1], q.shape[3], q.dtype, q.device)
        run = lambda kernels: probe(kind, *shape, kernels, queries, prefix, layouts)  # noqa: E731
        _CHOSEN[key] = probe_store.remembered(key, q.device, run, lambda: candidates(kind))
    return _CHOSEN[key][1]


def chosen() -> dict[str, Any]:
    """What each probe chose and measured: {"prefix 32/8x128 bfloat16 cuda:0": {"chosen": name,
    "candidates": {name: "1.2 ms" | "wrong: ..." | "failed: ..."}}}; a key names the call's layout
    where it is not compact (label_layouts) and a call's span past the first ("prefix 32/8x128 bfloat16
    cuda:0 over 64K keys", "causal 32/8x128 bfloat16 cuda:0 over 4K queries")."""
    return {
        f"{kind} {hq}/{hkv}x{d} {str(dtype).rsplit('.', 1)[-1]} {device}"
        f"{_span_label(kind, span)}{label_layouts(layouts)}": {"chosen": name, "candidates": report}
        for (kind, hq, hkv, d, dtype, device, layouts, span), (name, _, report) in _CHOSEN.items()
    }
