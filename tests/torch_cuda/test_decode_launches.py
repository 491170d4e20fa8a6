"""A decode step of an 8B on an H200 is launch-bound (results/gpu/h200/2026-11-29: 7.2 ms per token
replayed as a CUDA graph where the weights take 3.4 ms; ~1,250 kernels): every element-wise op
of a layer is one more launch in every step. These tests pin what the step launches and that the
fused forms compute bitwise what the reference formulas do."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from specfill.backends.torch_cuda import decode_graph
from specfill.backends.torch_cuda.model import RMSNorm
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

# aten ops that make a view (no kernel on any device)
VIEWS = {"view", "_unsafe_view", "t", "transpose", "slice", "split", "split_with_sizes", "expand", "select",
         "unsqueeze", "squeeze", "permute", "alias", "detach", "as_strided", "reshape", "_reshape_alias"}  # fmt: skip

# per decoder layer of a Llama-family step (no q/k norm): 5 products (qkv, o, gate, up, down), 2 RMSNorms
# (one fused op each) and their 2 weight products, RoPE of q and k together (x*cos, -half, cat, *sin,
# +), 2 cache writes, attention, SiLU and its product, 2 residual adds. Before (2026-11-29) the
# norms were 6 ops each (8 in bf16) and q and k were rotated apart: 34 ops (38 in bf16). On a GPU the
# rotation's five ops are one Triton launch, each norm with its weight product (and the residual add
# before each: the input norm takes the previous layer's MLP sum) another, and SiLU with its product a
# third (backends/torch_cuda/fused.py): 12 launches a layer there (tests/torch_cuda_kernels/fused_cases.py
# counts them with kernels forced).
LAYER_OPS = 21


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if not func.is_view and name not in VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _third_step_ops(layers: int) -> Counter[str]:
    """The ops of a static decode step (decode_graph.static_step, uncaptured) after the bucket's first."""
    model = make_tiny("llama", num_hidden_layers=layers).ours()
    model.ops.static_decode = True
    model.ops.decode_graphs = decode_graph.DecodeGraphs(None)
    steps = model.generate_step(
        prompt_ids(12), max_tokens=3, sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod(),
        info=GenerationInfo(),
    )  # fmt: skip
    next(steps), next(steps)
    with _Count() as count:
        next(steps)
    return count.ops


def test_a_decode_step_launches_at_most_layer_ops_per_layer():
    two, four = _third_step_ops(2), _third_step_ops(4)
    per_layer = (sum(four.values()) - sum(two.values())) / 2
    assert per_layer <= LAYER_OPS, (per_layer, four - two)
    assert (four - two)["rms_norm"] == 4  # two fused norms per layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fused_rms_norm_is_the_reference_formula_bitwise(dtype):
    """F.rms_norm (model.RMSNorm) against float32 statistics rounded once to the activation dtype,
    then the weight in that dtype (Hugging Face's order)."""
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(17, 1536, generator=generator) * 3).to(dtype)
    norm = RMSNorm(1536, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(1536, generator=generator))
        h = x.float()
        want = norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        assert torch.equal(norm(x), want)
        assert torch.equal(
            F.rms_norm(x, (1536,), eps=1e-6), (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        )
