"""Both methods with every Metal kernel forced (use_kernels=True) against the MLX-ops twins, at
model level: on a Mac through real Metal, elsewhere through the C++ emulator of the kernels
(tests/mlx_kernels/metal_emulator.py), which compiles the kernel sources with g++."""

from __future__ import annotations

import shutil

import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx.ops import MLXOps
from specfill.core.config import SpecPrefillConfig
from specfill.core.driver import CausalLM
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import assert_logits_close, greedy, h2o_method, prompt

HAS_METAL = bool(mx.metal.is_available())


def install_emulated_metal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every Metal kernel through the C++ emulator and report Metal as available."""
    from specfill.backends.mlx.kernels import dispatch, inter, intra, scoring
    from tests.mlx_kernels.metal_emulator import EmulatedKernel

    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    monkeypatch.setattr(
        intra,
        "_make_intra_kernel",
        lambda: (EmulatedKernel(**intra.INTRA_ATTENTION_SPEC), EmulatedKernel(**intra.INTRA_COLSUM_SPEC)),
    )
    monkeypatch.setattr(
        inter,
        "_make_inter_kernel",
        lambda: (EmulatedKernel(**inter.INTER_ATTENTION_SPEC), EmulatedKernel(**inter.INTER_COLSUM_SPEC)),
    )
    monkeypatch.setattr(
        scoring,
        "_make_scoring_kernel",
        lambda: (EmulatedKernel(**scoring.SCORING_STATS_SPEC), EmulatedKernel(**scoring.SCORING_PROBS_SPEC)),
    )


@pytest.fixture(
    params=[
        pytest.param(
            "metal",
            marks=pytest.mark.skipif(
                not HAS_METAL,
                reason="needs Apple silicon with MLX's Metal back-end; on a Mac the same pytest command runs it",
            ),
        ),
        pytest.param(
            "emulated",
            marks=pytest.mark.skipif(
                shutil.which("g++") is None,
                reason="the Metal emulator compiles the kernel sources with g++, which is missing",
            ),
        ),
    ]
)
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "emulated":
        install_emulated_metal(monkeypatch)
    return request.param


def with_kernels(model: CausalLM, use_kernels: bool) -> CausalLM:
    ops = MLXOps(model.ops.device, use_kernels, model.ops.quantized)
    return CausalLM(model.model, ops, prefill_step_size=model.prefill_step_size)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_h2o_prefill_on_the_kernels_matches_the_twins(tiny, kernels, arch):
    t = tiny(arch)
    ids = prompt(45, t.args.vocab_size, seed=11)  # partial last chunk, three logical batches
    method = h2o_method(8, 16, 2, 3)
    runs = {}
    for use in (True, False):
        info = GenerationInfo(record_memory=True)
        runs[use] = with_kernels(t.model, use).prompt_logits(ids, method=method, info=info), info.memory_sets
    assert_logits_close(t, runs[True][0], runs[False][0], f"{arch} H2O logits, kernels vs twins")
    for layer, (got, want) in enumerate(zip(runs[True][1], runs[False][1])):
        assert len(got) == len(want) == 5
        for chunk, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(g, w, err_msg=f"layer {layer} memory set M_{chunk}")
    assert greedy(with_kernels(t.model, True), ids, 3, method) == greedy(with_kernels(t.model, False), ids, 3, method)


def test_speculative_prefill_on_the_kernels_matches_the_twins(tiny, kernels):
    t = tiny("qwen2")
    ids = prompt(70, t.args.vocab_size, seed=12)
    method = PrefillMethod(
        "specprefill",
        speculator="self:2",
        specprefill=SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=4, pool_kernel=5),
    )
    kernel_info, twin_info = GenerationInfo(), GenerationInfo()
    tokens = greedy(with_kernels(t.model, True), ids, 4, method, kernel_info)
    assert tokens == greedy(with_kernels(t.model, False), ids, 4, method, twin_info)
    assert kernel_info.kept_positions == twin_info.kept_positions and kernel_info.kept_tokens < 70
