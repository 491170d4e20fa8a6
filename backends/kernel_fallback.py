"""When a hot stage's kernel gives way to its twin, for both backends' dispatchers (mlx/kernels,
torch_cuda/kernels): the Metal and Triton kernels take no attention terms (soft-cap, sinks), no
value head dim other than the keys' (latent attention) and no mask (a sliding window, an
observation window's query_start). Each of those runs the twin; the first two are said once."""

from __future__ import annotations

from specfill.core.self_check import note_term_fallback, note_value_dim_fallback
from specfill.core.stages import AttentionTerms


def kernel_runs(
    backend: str,
    twin: str,
    stage: str,
    kernel: bool,
    terms: AttentionTerms | None,
    masked: bool,
    value_dim_differs: bool = False,
) -> bool:
    """Whether `stage` runs its kernel, given the kernel-or-twin choice so far (kernel) and the
    call's active terms (core.stages.active_terms), mask and value head dim."""
    if kernel and terms is not None:
        note_term_fallback(backend, stage, twin)
    if kernel and value_dim_differs:
        note_value_dim_fallback(backend, stage, twin)
        return False
    return kernel and not masked and terms is None
