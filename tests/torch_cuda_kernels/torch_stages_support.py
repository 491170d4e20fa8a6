"""Shared helpers of the torch-backend stage tests (imported by the test modules next to it)."""

from __future__ import annotations

import torch

from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core import H2OConfig, H2OLayerResult, SpecPrefillConfig
from specfill.core.h2o_walk import h2o_attention_layer
from specfill.core.methods.specprefill import token_importance

# the device the kernel cases run on, and their dtypes: bfloat16 on a GPU only (the interpreter runs
# tiles in NumPy, which has no bfloat16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU_DTYPES = ["bfloat16"] if DEVICE == "cuda" else []
DTYPES = [torch.float32, torch.float16, *(getattr(torch, d) for d in GPU_DTYPES)]

# elementwise |got - want| <= atol + rtol * |want|, per dtype of the stored result; the 16-bit
# bounds are about 4 units in the last place (float16 2^-10, bfloat16 2^-7: its 8-bit mantissa),
# room for one rounding of the stored output plus a differently ordered fp32 accumulation
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 2e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    atol, rtol = TOL[dtype]
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    got64, want64 = got.double().cpu(), want.double().cpu()
    assert torch.equal(torch.isfinite(got64), torch.isfinite(want64)), f"{what}: non-finite values differ"
    finite = torch.isfinite(want64)
    err = (got64[finite] - want64[finite]).abs()
    bound = atol + rtol * want64[finite].abs()
    assert bool((err <= bound).all()), f"{what}: max error {float(err.max())} (atol {atol}, rtol {rtol})"


def randn(*shape: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def torch_ops(use_kernels: bool | None = False, device: str | torch.device = "cpu") -> TorchOps:
    """The backend's ops with the twins (False), the kernels (True) or the dispatcher's choice."""
    return TorchOps(torch.device(device), torch.float32, use_kernels)


def h2o_layer(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: H2OConfig, scale: float, use_kernels: bool | None = False
) -> H2OLayerResult:
    """The core's one H2O walk over the torch ops."""
    return h2o_attention_layer(torch_ops(use_kernels, q.device), q, k, v, config, scale)


def importance(
    queries: torch.Tensor, keys: torch.Tensor, config: SpecPrefillConfig, scale: float, use_kernels: bool | None = False
) -> torch.Tensor:
    """The core's layer-by-layer importance over the torch ops."""
    return token_importance(torch_ops(use_kernels, queries.device), queries, keys, config, scale)
