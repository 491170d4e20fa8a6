"""The prompt-cache hook of both backends: generate_step(reuse=info.kv of an earlier generation)
prefills only the new tokens, and the cache it leaves equals a fresh full prefill's."""

from __future__ import annotations

import numpy as np
import pytest

from specfill import load
from specfill.core import ConfigError, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig

FULL = PrefillMethod("full")
SAMPLE = SamplingConfig(temperature=1.0, seed=3)  # sampling reads the whole distribution, not just its top


@pytest.fixture(scope="module", params=["cuda", "mlx"])
def tiny(request):
    pytest.importorskip("torch" if request.param == "cuda" else "mlx.core")
    if request.param == "cuda":
        import torch

        torch.set_num_threads(1)
        return load("random:tiny-llama", backend="cuda", device="cpu", dtype="float32")
    return load("random:tiny-llama", backend="mlx")


def keys(kv: KVState, slots: int) -> np.ndarray:
    """Layer-0 and last-layer keys of the first `slots` slots as NumPy [2, Hkv, slots, D]."""
    every = kv.cache.keys(slots)  # [layers, Hkv, slots, D] on the backend (core/ops.py's KVCache)
    host = every.float().numpy() if hasattr(every, "float") else np.asarray(every)  # torch or MLX
    return host[[0, -1]]


def run(model, ids, max_tokens, *, method=FULL, reuse=None):
    info = GenerationInfo()
    out = list(
        model.generate_step(
            ids, max_tokens=max_tokens, sampling=SAMPLE, stop_ids=frozenset(), method=method, info=info, reuse=reuse
        )
    )
    return out, info


def test_reuse_equals_fresh_prefill(tiny):
    model, _ = tiny
    prompt = list(range(10, 60))
    first, info = run(model, prompt, 6)
    assert info.kv.tokens in (len(prompt) + 5, len(prompt) + 6)  # the last token fed or not (MLX overlaps)
    conversation = prompt + first + [7, 8, 9]
    held = info.kv.tokens
    second, reused = run(model, conversation, 5, reuse=KVState(info.kv.cache, held))
    fresh, dense = run(model, conversation, 5)
    assert second == fresh
    assert reused.kv.tokens == dense.kv.tokens
    np.testing.assert_allclose(keys(reused.kv, dense.kv.slots), keys(dense.kv, dense.kv.slots), atol=1e-5)


def test_reuse_truncates_and_grows(tiny):
    """A prefix shorter than the cache drops the slots past it; a small cache is grown."""
    model, _ = tiny
    _, info = run(model, list(range(5, 25)), 1)  # capacity 21
    conversation = list(range(5, 15)) + list(range(100, 160))  # shares 10 tokens, needs 70 + 4 slots
    second, reused = run(model, conversation, 4, reuse=KVState(info.kv.cache, 10))
    fresh, dense = run(model, conversation, 4)
    assert second == fresh
    np.testing.assert_allclose(keys(reused.kv, 70), keys(dense.kv, 70), atol=1e-5)


def test_specprefill_cache_reports_its_offset(tiny):
    """After SpecPrefill the cache holds the kept tokens: slots + offset = conversation tokens, and
    it can be extended as is (the approximate policy)."""
    model, _ = tiny
    prompt = list(range(1, 129))
    method = PrefillMethod(
        "specprefill", specprefill=SpecPrefillConfig(keep_ratio=0.25, select_chunk=8), speculator="self:1"
    )
    out, info = run(model, prompt, 3, method=method)
    offset = len(prompt) - info.kept_tokens
    assert info.kept_tokens < 40 and info.kv.position_offset == offset
    assert info.kv.tokens in (len(prompt) + 2, len(prompt) + 3)
    more, extended = run(model, prompt + out + [4, 5], 2, reuse=KVState(info.kv.cache, info.kv.slots, offset))
    assert len(more) == 2 and extended.kv.position_offset == offset
    assert extended.kv.tokens >= len(prompt) + len(out) + 2 + 1


def test_reuse_is_checked(tiny):
    model, _ = tiny
    _, info = run(model, list(range(20)), 1)
    with pytest.raises(ConfigError, match="needs a dense prefix"):  # H2O over SpecPrefill's kept tokens
        run(model, list(range(30)), 1, method=PrefillMethod("h2o"), reuse=KVState(info.kv.cache, 10, 5))
    with pytest.raises(ConfigError, match="must cover"):
        run(model, list(range(20)), 1, reuse=KVState(info.kv.cache, 20))
