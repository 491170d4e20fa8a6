"""evaluation/distributed_ttft.py (issue 39 item 4): the collectives' timers, the summary and its
table, and one tensor-parallel set-up on two ring ranks of a tiny model (skipped with the reason
where mlx.launch or the ring back-end cannot run here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from specfill.evaluation import distributed_ttft as dist
from tests.mlx_distributed.launch import unavailable


def _rows(ttfts: list[float], share: float) -> list[dict]:
    return [
        {
            "method": method,
            "ttft_s": ttft,
            "instrumented_ttft_s": ttft,
            "communication_s": share * ttft,
            "communication_share": share,
            "collective_calls": 0 if share == 0 else 8,
            "collective_bytes": 0 if share == 0 else 4096,
        }
        for method, ttft in zip(dist.METHODS, ttfts)
    ]


def test_summary_takes_the_slowest_rank_against_one_process():
    setups = {
        "one": [{"size": 1, "rows": _rows([2.0, 1.0, 0.5], 0.0)}],
        "tensor": [{"size": 2, "rows": _rows([3.0, 1.0, 1.0], 0.25)}, {"size": 2, "rows": _rows([4.0, 1.5, 1.0], 0.5)}],
    }
    rows = {(r["kind"], r["method"]): r for r in dist.summarize(setups)}
    assert rows["tensor", "full"]["slowest_rank_ttft_s"] == 4.0
    assert rows["tensor", "full"]["vs_one_process"] == pytest.approx(2.0)
    assert rows["tensor", "h2o"]["vs_one_process"] == pytest.approx(1.5)
    assert rows["tensor", "specprefill"]["communication_share_by_rank"] == [0.25, 0.5]
    assert rows["one", "full"]["vs_one_process"] == pytest.approx(1.0)
    result = {
        "model": "m",
        "speculator": "s",
        "tokens": 64,
        "dtype": "float32",
        "machine": "x",
        "rows": list(rows.values()),
    }
    table = dist.markdown(result)
    assert "| tensor | full | 3.00 | 4.00 | 2.00x |" in table and "25% / 50%" in table


def test_collectives_are_timed_only_while_active_with_their_inputs_evaluated_first():
    import mlx.core as mx

    collectives = dist.Collectives()
    try:
        x = mx.ones((256, 256))
        mx.distributed.all_sum(x)  # inactive: not counted
        assert collectives.calls == 0
        collectives.active = True
        slow = (x @ x) @ x  # lazily built: evaluated before the clock starts
        start = time.perf_counter()
        out = mx.distributed.all_sum(slow)
        elapsed = time.perf_counter() - start
        assert collectives.calls == 1 and collectives.bytes == out.nbytes
        assert 0 <= collectives.seconds <= elapsed
    finally:
        for name, function in collectives.original.items():
            setattr(mx.distributed, name, function)


@pytest.mark.slow
def test_a_tensor_parallel_setup_on_two_ranks_times_its_all_sums(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    shape = dist.SHAPES["tiny"]
    model = dist.build_model(tmp_path / "model", shape)
    speculator = dist.build_model(tmp_path / "speculator", shape, layers=1, seed=1)
    setups = dist.run_setups(model, speculator, 32, kinds=("tensor",), limit_s=120)
    ranks = setups["tensor"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["size"] == 2 for r in ranks)
    for rank in ranks:
        assert [row["method"] for row in rank["rows"]] == list(dist.METHODS)
        for row in rank["rows"]:
            assert row["collective_calls"] > 0 and row["collective_bytes"] > 0  # o_proj / down_proj all-sums
            assert 0 < row["communication_s"] <= row["instrumented_ttft_s"]
