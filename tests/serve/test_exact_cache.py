"""What the exact prompt cache guarantees (docs/serve.md, Prompt cache): a turn extending a cached
conversation attends to the same keys, at the same positions, with the same weights and dtype as a
dense (full prefill) run of the whole conversation; only the order of the floating-point work
differs (the reply's KV came from one-token decode steps, the new tokens are prefilled on another
step grid, a sparse turn's KV is rebuilt in COMPLETION_STEP pieces). So its KV cache equals the
dense run's to within rounding: a few units in the last place of the dtype, bitwise on MLX's CPU
device. A bug that moves a position or loses a key changes the KV by O(1) (checked below), two
orders of magnitude past the bound even in bfloat16."""

from __future__ import annotations

import numpy as np
import pytest

from specfill import load
from specfill.core.config import H2OConfig
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from specfill.serve.prompt_cache import PromptCache, Reuse

FULL = PrefillMethod("full")
H2O = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=0))
ULP = {"float32": 2.0**-23, "bfloat16": 2.0**-7}  # relative spacing of the dtype's numbers
ULPS = 8  # observed: torch CPU <= 2 ulps in both dtypes, MLX CPU 0


@pytest.fixture(
    scope="module",
    params=[(b, d) for b in ("cuda", "mlx") for d in ("float32", "bfloat16")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def tiny(request):
    backend, dtype = request.param
    pytest.importorskip("torch" if backend == "cuda" else "mlx.core")
    if backend == "cuda":
        import torch

        torch.set_num_threads(1)
    model, _ = load(
        "random:tiny-llama", backend=backend, dtype=dtype, **({"device": "cpu"} if backend == "cuda" else {})
    )
    return model, dtype


def kv_arrays(kv: KVState, slots: int) -> np.ndarray:
    """Every layer's keys and values of the first `slots` slots, float32 NumPy [layers, 2, Hkv, slots, D]."""
    if hasattr(kv.cache, "k"):  # torch: every layer's keys (values) in one tensor
        return np.stack(
            [kv.cache.k[:, 0, :, :slots].float().numpy(), kv.cache.v[:, 0, :, :slots].float().numpy()], axis=1
        )
    import mlx.core as mx  # MLX: one LayerKVCache per layer

    return np.stack(
        [
            np.stack(
                [
                    np.asarray(c.keys[0, :, :slots].astype(mx.float32)),
                    np.asarray(c.values[0, :, :slots].astype(mx.float32)),
                ]
            )
            for c in kv.cache.layers
        ]
    )


def run(model, ids: list[int], max_tokens: int, method: PrefillMethod = FULL, reuse: KVState | None = None):
    info = GenerationInfo()
    out = list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=method,
            info=info,
            reuse=reuse,
        )
    )
    return out, info


def worst_ulps(got: KVState, dense: KVState, dtype: str) -> float:
    """The largest difference over every layer's K and V, in ulps of the dtype relative to the
    tensor's largest entry."""
    slots = min(got.slots, dense.slots)
    a, b = kv_arrays(got, slots), kv_arrays(dense, slots)
    scale = np.abs(b).max(axis=(2, 3, 4))
    return float((np.abs(a - b).max(axis=(2, 3, 4)) / scale).max() / ULP[dtype])


def conversation(model, method: PrefillMethod):
    rng = np.random.default_rng(0)
    prompt = rng.integers(4, model.args.vocab_size, 50).tolist()
    reply, info = run(model, prompt, 6, method)
    return prompt, reply, rng.integers(4, model.args.vocab_size, 20).tolist(), info


def test_a_cached_turn_equals_a_dense_run_to_rounding(tiny):
    model, dtype = tiny
    prompt, reply, more, first = conversation(model, FULL)
    ids = prompt + reply + more
    _, cached = run(model, ids, 4, reuse=KVState(first.kv.cache, first.kv.tokens))
    _, dense = run(model, ids, 4)
    assert cached.kv.tokens == dense.kv.tokens
    assert worst_ulps(cached.kv, dense.kv, dtype) <= ULPS


def test_a_rebuilt_sparse_turn_equals_a_dense_run_to_rounding(tiny):
    """H2O turn 1 under the exact policy: its KV is dropped and rebuilt densely in idle steps."""
    model, dtype = tiny
    prompt, reply, more, first = conversation(model, H2O)
    store = PromptCache(max_tokens=4096, context=model.args.max_position_embeddings)
    store.put(prompt + reply, first.kv, prompt_tokens=len(prompt), method="h2o", reuse=Reuse(), policy="exact")
    while store.pending() is not None:
        store.complete_step(model)
    reuse = store.take(prompt + reply + more, "exact")
    assert reuse.exact and reuse.cached == len(prompt + reply)
    _, cached = run(model, prompt + reply + more, 4, reuse=reuse.state)
    _, dense = run(model, prompt + reply + more, 4)
    assert worst_ulps(cached.kv, dense.kv, dtype) <= ULPS


def test_the_bound_catches_a_position_one_off(tiny):
    """The check can fail: a cache one slot short, read one position on, is far outside it."""
    model, dtype = tiny
    prompt, reply, more, first = conversation(model, FULL)
    ids = prompt + reply + more
    _, wrong = run(model, ids, 4, reuse=KVState(first.kv.cache, first.kv.tokens - 1, 1))
    _, dense = run(model, ids, 4)
    assert worst_ulps(wrong.kv, dense.kv, dtype) > 10 * ULPS
