"""Kernel-or-twin choice shared by the three dispatchers.

The kernel setting: use_kernels True / False forces the Metal kernel / the MLX-ops twin; None
reads SPECFILL_KERNELS (auto | on | off, unset = auto). In auto, a kernel runs only after passing
its first-use self-check (core/self_check.py) for its dtype and shape class.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Callable

import mlx.core as mx
import numpy as np

from specfill.backends import kernel_fallback
from specfill.core.errors import BackendUnavailableError
from specfill.core.self_check import kernels_setting
from specfill.core.self_check_cases import CheckCases


def metal_available() -> bool:
    """True on Apple silicon with MLX's Metal back-end (False on MLX's Linux CPU build)."""
    return bool(mx.metal.is_available())


def choose_kernel(use_kernels: bool | None, stage: str, self_check: Callable[[], bool] | None = None) -> bool:
    """None reads SPECFILL_KERNELS; auto: the Metal kernel where Metal exists and `self_check()`
    (the first-use self-check, run once per process and key) passes, else the MLX-ops twin;
    True forces the kernel (a clear error without Metal); False forces the twin."""
    use_kernels = kernels_setting(use_kernels)
    if use_kernels is None:
        return metal_available() and (self_check is None or self_check())
    if use_kernels and not metal_available():
        raise BackendUnavailableError(
            f"the Metal kernel for {stage} needs Apple silicon with MLX's Metal back-end; "
            "this MLX has none (use the MLX-ops twins: kernels off/auto)"
        )
    return bool(use_kernels)


# kernel_runs(stage, kernel, terms, masked, value_dim_differs=False): kernel_fallback.kernel_runs on MLX
kernel_runs = partial(kernel_fallback.kernel_runs, "mlx", "the MLX-ops twin")


def common_dtype(*arrays: mx.array) -> mx.Dtype:
    """The one floating dtype of a stage's inputs (checked on both paths, so kernel and twin
    accept exactly the same inputs)."""
    dtype = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dtype:
            raise ValueError(f"attention inputs must share one dtype, got {dtype} and {a.dtype}")
    if dtype not in (mx.float32, mx.float16, mx.bfloat16):
        raise ValueError(f"attention inputs must be float32, float16 or bfloat16, got {dtype}")
    return dtype


def metal_kernels(*specs: dict) -> Callable[[], tuple[object, ...]]:
    """A stage's kernel builder: builds the Metal kernels of `specs` (mx.fast.metal_kernel's arguments)
    on its first call and hands the same ones out after (MLX compiles them per template)."""
    return cache(lambda: tuple(mx.fast.metal_kernel(**spec) for spec in specs))


def _case_random(shape: tuple[int, ...], like: mx.array, seed: int) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(like.dtype)


# the first-use self-check's seeded cases (core/self_check_cases.py); reading a result back
# evaluates it, so a Metal compile or launch error surfaces inside the check
SELF_CHECK = CheckCases(
    "mlx",
    "the MLX-ops twin",
    _case_random,
    lambda x: np.asarray(x.astype(mx.float32), dtype=np.float64),
    lambda dtype: str(dtype).removeprefix("mlx.core."),
)
