"""The torch backend's CUDA-only lines, executed without a GPU (tests/torch_cuda/simulated_gpu.py).

CPU tensors take every `on_cuda` branch: bf16 default, CUDA attention strategies (SDPA for a
decode step, the lower-right causal bias for a prefill step after cached slots), the kernel
dispatchers with their first-use self-checks, each launch's tiles for the GPU's architecture
(up to the launch, whose outputs the twin fills), timing synchronisation, memory reporting and
doctor's GPU facts. Results must equal the plain CPU run's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import cuda_available, resolve_device, resolve_dtype
from specfill.backends.torch_cuda.kernels.dispatch import triton_installed
from specfill.backends.torch_cuda.kernels.tiles import flash_tiles, scoring_tiles
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import greedy
from tests.torch_cuda.simulated_gpu import simulated
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

pytestmark = pytest.mark.skipif(not triton_installed(), reason="Triton is not installed (Linux only)")

H2O = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=16, batch_size=32, local=4, heavy=4, dense_tail=0))
SPEC = PrefillMethod(
    "specprefill",
    speculator="self:1",
    specprefill=SpecPrefillConfig(keep_ratio=0.3, lookahead=2, select_chunk=8, pool_kernel=3),
)


def test_device_and_dtype_choice(monkeypatch):
    import specfill.backends.torch_cuda.loader as loader
    from specfill.backends.torch_cuda.conformance import make_adapter

    monkeypatch.setattr(loader, "has_fast_bf16", lambda: False)  # a CPU without AVX-512 BF16 or AMX
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    with simulated(monkeypatch):
        assert cuda_available() and resolve_device(None) == torch.device("cuda")
        assert resolve_device("cuda:0") == torch.device("cuda:0")
        assert resolve_dtype(None, torch.device("cpu")) == torch.bfloat16
        assert make_adapter().ops.device.type == "cuda"
        assert make_adapter(device="cpu", use_kernels=True).ops.use_kernels is True


@pytest.mark.parametrize(
    "capability,dtype",
    [((8, 6), torch.float32), ((8, 9), torch.bfloat16), ((9, 0), torch.float16), ((8, 7), torch.float32)],
)
def test_attention_launches_take_the_gpus_tiles(monkeypatch, capability, dtype):
    from specfill.backends.torch_cuda.kernels import inter_attention, intra_attention
    from specfill.backends.torch_cuda.kernels.intra import intra_attention_twin

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype) for shape in ((4, 40, 80), (2, 40, 80), (2, 40, 80)))
    want = intra_attention_twin(q, k, v, 16, 0.1, with_colsum=True)
    with simulated(monkeypatch, capability) as gpu:
        got = intra_attention(q, k, v, 16, 0.1)
        inter_attention(q, k[:, :24], v[:, :24], 0.1)
    arch = capability[0] * 10 + capability[1]
    tiles = flash_tiles(128, dtype, arch)
    grid, launch = gpu["forward"].launches[-1]
    assert (launch["BLOCK_M"], launch["BLOCK_N"], launch["BLOCK_D"]) == (tiles.block_m, tiles.block_n, 128)
    assert (launch["num_warps"], launch["num_stages"]) == (tiles.num_warps, tiles.num_stages)
    assert launch["BLOCK_DIAGONAL"] is False and grid == (-(-40 // tiles.block_m), 4)
    assert launch["PRECISION"] == ("ieee" if dtype == torch.float32 else "tf32")
    assert any(kw["BLOCK_DIAGONAL"] for _, kw in gpu["forward"].launches) and gpu["colsum"].launches
    for name in ("m", "l", "o"):
        torch.testing.assert_close(getattr(got.state, name), getattr(want.state, name))
    torch.testing.assert_close(got.colsum, want.colsum)


def test_scoring_launch_takes_the_gpus_tiles(monkeypatch):
    from specfill.backends.torch_cuda.kernels import attention_scores, attention_scores_twin
    from specfill.backends.torch_cuda.kernels.scoring_triton import SPLIT_KEYS

    gen = torch.Generator().manual_seed(4)
    queries, keys = torch.randn(2, 3, 8, 128, generator=gen), torch.randn(2, 2, 50, 128, generator=gen)
    with simulated(monkeypatch, (8, 6)) as gpu:
        got = attention_scores(queries, keys, 0.09)
    (stats_grid, stats), (grid, launch) = gpu["scoring"].launches[-2:]  # the ranges' statistics, then the probs
    tiles = scoring_tiles(4 * 3, 128, torch.float32, 86)
    assert (launch["BLOCK_R"], launch["BLOCK_N"], launch["num_warps"]) == (
        tiles.block_m,
        tiles.block_n,
        tiles.num_warps,
    )
    assert stats["STATS"] is True and launch["STATS"] is False and stats["BLOCK_R"] == launch["BLOCK_R"]
    assert grid == stats_grid == (2 * 2, 1, 1)  # (layers x KV heads, row blocks, ranges of SPLIT_KEYS keys)
    torch.testing.assert_close(got, attention_scores_twin(queries, keys, 0.09))
    long_keys = torch.randn(2, 2, 2 * SPLIT_KEYS + 52, 128, generator=gen)  # two whole ranges and a short one
    with simulated(monkeypatch, (8, 6)) as gpu:
        got = attention_scores(queries, long_keys, 0.09)
    assert [grid for grid, _ in gpu["scoring"].launches[-2:]] == [(2 * 2, 1, 3)] * 2
    torch.testing.assert_close(got, attention_scores_twin(queries, long_keys, 0.09))


def test_model_methods_and_decode_on_a_simulated_gpu(monkeypatch):
    """H2O logits and SpecPrefill greedy tokens (prefill in 16-token steps, so the lower-right
    causal path runs; decode steps take SDPA) match the CPU run; the kernels were "launched"."""
    tiny = make_tiny("llama", seed=21)
    ids = prompt_ids(50, seed=21)
    model = tiny.ours(step=16)
    want_logits = model.prompt_logits(ids, method=H2O, info=GenerationInfo())
    want_tokens = greedy(model, ids, 4, SPEC)
    plain = greedy(model, ids, 4)
    with simulated(monkeypatch) as gpu:
        simulated_model = tiny.ours(step=16)
        got_logits = simulated_model.prompt_logits(ids, method=H2O, info=GenerationInfo())
        assert greedy(simulated_model, ids, 4, SPEC) == want_tokens
        assert greedy(simulated_model, ids, 4) == plain
        assert "Simulated GPU" in simulated_model.device_name and simulated_model.peak_memory_gb() == 3.0
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-5 * np.abs(want_logits).max())
    assert gpu["forward"].launches and gpu["colsum"].launches and gpu["scoring"].launches
    assert gpu["runtime"].synchronized >= 2  # the prefill timers wait for the device


def test_doctor_reports_the_gpu(monkeypatch):
    from specfill.evaluation.doctor import kernel_skip_reason, torch_facts

    with simulated(monkeypatch, (8, 7)):
        facts = torch_facts()
    assert facts["cuda_available"] and facts["gpu"] == "Simulated GPU" and facts["gpu_memory_gb"] == 24.0
    assert facts["compute_capability"] == "8.7" and facts["triton_kernels_unavailable"] is None
    assert kernel_skip_reason("cuda", {"torch": facts}) is None
