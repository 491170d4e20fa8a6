"""H2O's two attention stages on CPU through torch's fused flash kernel, column sums included.

On a CPU the Triton kernels do not run, and the torch twins (intra.py, inter.py) materialise every
block's logits in float32 to get the column sums H2O ranks keys by: bound by writing the logits,
where the fused flash kernel full prefill uses multiplies bfloat16 on AMX at 420-660 GFLOP/s
(research/bf16_cpu/results/bf16_turns_analysis.md). This path runs both stages on that kernel,
`aten::_scaled_dot_product_flash_attention_for_cpu`, which also returns each row's log-sum-exp:

- the state: o = softmax(s) @ v and m = lse, l = 1 (the twins give the max and the sum: only
  m + log l enters a merge);
- the column sums sum_i exp(s_ij - lse_i), by a second flash pass with the roles swapped (keys as
  queries, queries as keys) whose own log-sum-exp per key IS the column sum's log, once each query
  carries its -lse_i as a logit bias: two more coordinates, q'_i = [q_i, hi_i, lo_i] with
  hi_i + lo_i = -lse_i / scale split in two of the input dtype (a bias in one would round by ~0.4%
  of lse_i), k'_j = [k_j, 1, 1]. Phase 1's causal mask (i >= j within a chunk) becomes the
  kernel's own causal mask on both axes reversed. The values of that pass are never read.

Where it runs (`cpu_flash_runs`): CPU tensors in bfloat16 or float16 (what the Triton kernels would
take on a GPU) when those do not run, no sliding window, no soft-cap, values of the keys' head
size; sinks join the column sums' denominators (the twins' rule: lse_i there is the row's
log-sum-exp with its head's sink, the state stays sink-free); the kernel setting off
(SPECFILL_KERNELS=off, use_kernel False) keeps the twins.

Tolerances (tests/torch_cuda_kernels/test_cpu_flash.py): the output as full prefill's own flash kernel gives
it (float32 accumulation, one rounding to the input dtype); the column sums to ~1e-3 relative (the
bias split and the kernel's float32 exp), so ranks differ from the twins' only between keys whose
scores are that close.
"""

from __future__ import annotations

import torch

from specfill.core.self_check import kernels_setting
from specfill.core.stages import AttentionState, AttentionTerms, InterResult, IntraResult, sinks_of, softcap_of

from .cpu_units import full_width

FLASH_DTYPES = (torch.bfloat16, torch.float16)


def _flash_op():
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def cpu_flash_runs(
    use_kernel: bool | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    terms: AttentionTerms | None,
    window: object | None,
) -> bool:
    """Whether a stage the Triton kernels do not run goes through torch's CPU flash kernel (above)."""
    return (
        kernels_setting(use_kernel) is not False
        and q.device.type == "cpu"
        and q.dtype in FLASH_DTYPES
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and softcap_of(terms) is None
        and window is None
        and v.shape[-1] == k.shape[-1]
        and _flash_op() is not None
    )


def _flash(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, L, D] x [B, H / G, S, D] -> output [B, H, L, D] (q's dtype), lse [B, H, L] float32;
    query head h reads key and value head h // G (the kernel's own GQA, as attention.py's prefill
    calls it: the numbers of the keys and values repeated per head)."""
    return _flash_op()(q, k, v, 0.0, causal, scale=scale)


def _column_sums(q, k, lse, causal: bool, scale: float) -> torch.Tensor:
    """sum_i exp(scale * q_i . k_j - lse_i) per key j, [B, H, S] float32 (the module doc's swapped
    pass); q [B, H, L, D], k [B, H / G, S, D] (head h reads k's head h // G), lse [B, H, L].
    causal: L == S and query i sees keys j <= i."""
    bias = -lse / scale
    high = bias.to(q.dtype)
    low = (bias - high.float()).to(q.dtype)
    queries = torch.cat([q, high[..., None], low[..., None]], dim=-1)
    keys = torch.cat([k, k.new_ones(1, 1, 1, 1).expand(*k.shape[:-1], 2)], dim=-1)
    if causal:  # key j meets queries i >= j: on both axes reversed, the kernel's own mask
        queries, keys = queries.flip(-2), keys.flip(-2)
    if keys.shape[1] != queries.shape[1]:  # one swapped query head per query head (its own bias)
        keys = keys.repeat_interleave(queries.shape[1] // keys.shape[1], dim=1)
    # the values are never read; zeros broadcast over batch and heads only: zero-stride rows made torch's
    # CPU kernel 30-100x slower when the swapped call's key count (L) is under 64 (a short last chunk, a
    # dense-tail block split by a chunk line: 29 keys against 10,607 rows 1.27 s instead of 28 ms, bf16,
    # 2 threads) and up to 1.3x at other counts that are not multiples of 64
    values = queries.new_zeros(1, 1, *queries.shape[-2:]).expand_as(queries)
    _, lse_swapped = _flash(keys, queries, values, causal, scale)
    sums = torch.exp(lse_swapped)
    return sums.flip(-1) if causal else sums


def _with_sinks(lse: torch.Tensor, terms: AttentionTerms | None, heads_axis: tuple[int, ...]) -> torch.Tensor:
    """lse with each query head's sink logit in its sum (sinks [Hq] reshaped to `heads_axis`, which
    broadcasts against lse); lse itself without sinks."""
    sinks = sinks_of(terms)
    if sinks is None:
        return lse
    return torch.logaddexp(lse, sinks.to(device=lse.device, dtype=lse.dtype).reshape(heads_axis))


def _state(out: torch.Tensor, lse: torch.Tensor) -> AttentionState:
    """A flash call's output and log-sum-exp (float32: the stages' statistics dtype for 16-bit inputs)
    as the stages' online-softmax state (m = lse, l = 1)."""
    return AttentionState(m=lse, l=torch.ones_like(lse), o=out)


def intra_attention_flash(q, k, v, chunk_size: int, scale: float, with_colsum: bool = True, terms=None) -> IntraResult:
    """Phase 1 (intra.py's stage, no window, no soft-cap) on the CPU flash kernel: the full chunks as
    the batch of one causal call, a partial last chunk as another."""
    n_heads, n_tokens, _ = q.shape
    m = torch.empty((n_heads, n_tokens), dtype=torch.float32)
    o = torch.empty_like(q)
    colsum = torch.empty_like(m) if with_colsum else None
    n_full = n_tokens // chunk_size
    pieces = [(0, n_full, chunk_size), (n_full * chunk_size, 1, n_tokens - n_full * chunk_size)]
    with full_width(q.device):
        for start, n_chunks, size in pieces:
            if n_chunks == 0 or size == 0:
                continue
            end = start + n_chunks * size

            def chunked(x: torch.Tensor) -> torch.Tensor:  # [H, n*S, D] -> [n, H, S, D]
                return x[:, start:end].unflatten(1, (n_chunks, size)).transpose(0, 1).contiguous()

            # the kernel maps the G query heads of a KV head onto it (GQA): the same numbers as with
            # the keys and values repeated per head, ~20% faster and without the copies (the 0.5B at
            # 32K, [32, 14, 1024, 64], bf16, 2 threads: 251 ms against 311); the swapped pass
            # repeats its (augmented) keys itself
            qc, kc = chunked(q), chunked(k)
            out, lse = _flash(qc, kc, chunked(v), True, scale)
            m[:, start:end] = lse.transpose(0, 1).flatten(1, 2)
            o[:, start:end] = out.transpose(0, 1).flatten(1, 2)
            if colsum is not None:
                lse_sinks = _with_sinks(lse, terms, (1, n_heads, 1))
                colsum[:, start:end] = _column_sums(qc, kc, lse_sinks, True, scale).transpose(0, 1).flatten(1, 2)
    return IntraResult(_state(o, m), colsum)


def inter_attention_flash(q, k_mem, v_mem, scale: float, with_colsum: bool = True, terms=None) -> InterResult:
    """Phase 2 (inter.py's stage, no window, no soft-cap; M >= 1) on the CPU flash kernel: the G query
    heads of a KV head folded into the rows of one unmasked call."""
    n_heads, n_tokens, head_dim = q.shape
    n_kv, n_mem = k_mem.shape[:2]
    group = n_heads // n_kv
    with full_width(q.device):
        out, lse = _flash(q.reshape(1, n_kv, group * n_tokens, head_dim), k_mem[None], v_mem[None], False, scale)
        colsum = None
        if with_colsum:
            keys = k_mem[:, None].expand(n_kv, group, n_mem, head_dim)
            rows = q.reshape(n_kv, group, n_tokens, head_dim)
            lse_sinks = _with_sinks(lse.reshape(n_kv, group, n_tokens), terms, (n_kv, group, 1))
            colsum = _column_sums(rows, keys, lse_sinks, False, scale).reshape(n_heads, n_mem)
    state = _state(out.reshape(n_heads, n_tokens, head_dim), lse.reshape(n_heads, n_tokens))
    return InterResult(state, colsum)
