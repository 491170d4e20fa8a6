"""What H2O's phase-2 walk issues per chunk step on the torch backend's CUDA path
(scripts/count_h2o_ops.py, results/gpu/h2o_walk_ops.md): on a GPU the walk is host-bound, so the
launches per chunk step are held to their budget and no step may wait for the device."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from specfill.backends.torch_cuda.kernels.dispatch import triton_installed
from specfill.core.config import H2OConfig

pytestmark = pytest.mark.skipif(not triton_installed(), reason="Triton is not installed (Linux only)")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "count_h2o_ops.py"

# 4 chunks per logical batch, as S = 1024, B = 4096 (the defaults until B became 16384: 16 chunks a batch on a
# GPU's 16K steps); before the batched merge the walk took 40 launches per chunk step in float32 and 43 in
# bfloat16 at Llama-3.1-8B's shape
BUDGET = {torch.float32: 20.0, torch.bfloat16: 21.0}


def _count_walk():
    spec = importlib.util.spec_from_file_location("count_h2o_ops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.count_walk


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_walk_launches_per_chunk_step(dtype):
    config = H2OConfig(chunk_size=32, batch_size=128, local=8, heavy=8, dense_tail=0)
    result = _count_walk()(512, n_heads=4, n_kv=2, head_dim=16, dtype=dtype, config=config)
    assert result["chunk_steps"] == 15
    assert result["syncs_per_step"] == 0, result["ops"]
    assert result["launches_per_step"] <= BUDGET[dtype], result["launches_per_step_by_stage"]
    by_stage = result["launches_per_step_by_stage"]
    assert by_stage["gather_memory"] == 2 and by_stage["inter_attention"] == 3 and by_stage["accumulate_scores"] == 1


def test_whole_batches_of_a_gpu_step_launch_less_per_chunk():
    """B's default (16384) makes a GPU's 16K prefill steps whole logical batches: 16 chunks share a
    phase 1 and a merge where 4 did (results/gpu/h2o_walk_ops.md: 19.0 -> 14.6 launches a chunk step at 32K)."""
    count = _count_walk()
    per_step = {}
    for chunks in (4, 16):
        config = H2OConfig(chunk_size=32, batch_size=32 * chunks, local=8, heavy=8, dense_tail=0)
        per_step[chunks] = count(512, n_heads=4, n_kv=2, head_dim=16, dtype=torch.bfloat16, config=config)[
            "launches_per_step"
        ]
    assert per_step[16] < per_step[4] - 3, per_step
    assert H2OConfig().batch_size == 16384
