"""The conformance group for hybrid caches (conformance/checks_hybrid_cache.py): it passes on MLX's
tiny random Qwen3.5, catches a cache that does not restore its recurrent state or leaves a stopped
step in place, and is one skipped result, with its reason, where a backend has no hybrids."""

from __future__ import annotations

import pytest

from specfill.conformance import adapter_factory, render_markdown, run_group
from specfill.conformance.runner import Report


def failed(results) -> list[str]:
    return [f"{r.check} [{r.case}]: {r.detail}" for r in results if not r.passed]


def test_the_reference_records_one_skip_with_its_reason():
    results = run_group(adapter_factory("reference")(dtype="float64"), "float64", "hybrid_cache")
    assert [(r.check, r.passed, r.tolerance) for r in results] == [("hybrid_cache", True, "skipped")]
    assert "no hybrid models" in results[0].detail
    assert "skipped: the reference backend has no hybrid" in render_markdown(
        Report("reference", ["float64"], results=results)
    )


@pytest.fixture(scope="module")
def mlx_adapter():
    pytest.importorskip("mlx_lm")
    return adapter_factory("mlx")(dtype="float32", use_kernels=None)


def test_mlx_hybrid_cache_conforms(mlx_adapter):
    results = run_group(mlx_adapter, "float32", "hybrid_cache")
    assert len(results) > 40 and not failed(results)
    assert {r.check for r in results} >= {
        "hybrid_cache.logits",
        "hybrid_cache.recurrent",
        "hybrid_cache.exact_prefix",
        "hybrid_cache.refusal",
        "hybrid_cache.cancelled",
    }


def test_planted_bugs_in_the_hybrid_cache_fail(mlx_adapter, monkeypatch):
    from specfill.backends.mlx.hybrid_cache import HybridKVCache

    with monkeypatch.context() as m:
        m.setattr(HybridKVCache, "_restore", lambda self, snapshot: None)  # the recurrent state never goes back
        assert any("hybrid_cache.recurrent" in f for f in failed(run_group(mlx_adapter, "float32", "hybrid_cache")))
    with monkeypatch.context() as m:
        m.setattr(HybridKVCache, "_interrupted", lambda self: None)  # a stopped step left in place
        assert any("hybrid_cache.cancelled" in f for f in failed(run_group(mlx_adapter, "float32", "hybrid_cache")))
