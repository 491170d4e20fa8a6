"""The conformance group for hybrid caches (conformance/checks_hybrid_cache.py): it passes on each
backend's tiny random Qwen3.5 (mlx-lm's on MLX, transformers' qwen3_5_text on the torch backend's
CPU), catches a cache that does not restore its recurrent state or leaves a stopped step in place,
and is one skipped result, with its reason, where a backend has no hybrids."""

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


@pytest.fixture(scope="module", params=["mlx", "cuda"])
def hybrid_adapter(request):
    """(the backend's conformance adapter in float32, its HybridKVCache class)."""
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
        from specfill.backends.mlx.hybrid_cache import HybridKVCache

        return adapter_factory("mlx")(dtype="float32", use_kernels=None), HybridKVCache
    pytest.importorskip("transformers")
    from specfill.backends.torch_cuda.hybrid_cache import HybridKVCache

    return adapter_factory("cuda")(dtype="float32", device="cpu"), HybridKVCache


def test_the_hybrid_cache_conforms(hybrid_adapter):
    results = run_group(hybrid_adapter[0], "float32", "hybrid_cache")
    assert len(results) > 40 and not failed(results)
    assert {r.check for r in results} >= {
        "hybrid_cache.logits",
        "hybrid_cache.recurrent",
        "hybrid_cache.exact_prefix",
        "hybrid_cache.refusal",
        "hybrid_cache.cancelled",
    }


def test_planted_bugs_in_the_hybrid_cache_fail(hybrid_adapter, monkeypatch):
    adapter, cache_class = hybrid_adapter
    with monkeypatch.context() as m:
        m.setattr(cache_class, "_restore", lambda self, snapshot: None)  # the recurrent state never goes back
        assert any("hybrid_cache.recurrent" in f for f in failed(run_group(adapter, "float32", "hybrid_cache")))
    with monkeypatch.context() as m:
        m.setattr(cache_class, "_interrupted", lambda self: None)  # a stopped step left in place
        assert any("hybrid_cache.cancelled" in f for f in failed(run_group(adapter, "float32", "hybrid_cache")))
