"""Causal attention over the KV cache against masked SDPA, the cache's capacity check and the
pluggable prefill attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specfill.backends.torch_cuda import attention
from specfill.backends.torch_cuda.attention import causal_attention, lower_right_causal
from specfill.backends.torch_cuda.cache import ModelKVCache
from specfill.core.errors import PromptTooLongError
from specfill.core.methods.prefill import prefill
from specfill.core.models import ModelArgs
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

ARGS = ModelArgs(
    architecture="llama",
    vocab_size=16,
    hidden_size=48,
    intermediate_size=8,
    num_hidden_layers=1,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=8,
)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Float64 attention where query t (slot start + t) sees slots 0..start + t."""
    q, k, v = q.double(), k.double().repeat_interleave(3, 1), v.double().repeat_interleave(3, 1)
    steps, end = q.shape[2], k.shape[2]
    visible = torch.arange(end)[None, :] <= start + torch.arange(steps)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)


@pytest.mark.parametrize("private_flash_op", [True, False], ids=["cpu-flash-op", "no-private-op"])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("start,steps", [(0, 1), (0, 17), (9, 1), (9, 3), (40, 8), (40, 9), (9, 13), (40, 24)])
def test_causal_attention_over_cached_prefix(start, steps, dtype, tolerance, private_flash_op, monkeypatch):
    """Also where a torch build lacks the private CPU flash op: the generic masked path."""
    if not private_flash_op:
        monkeypatch.setattr(attention, "_cpu_flash", lambda: None)
    gen = torch.Generator().manual_seed(start * 100 + steps)
    cache = ModelKVCache.allocate(ARGS, 80, dtype, "cpu").layers[0]
    k_all = torch.randn(1, 2, start + steps, 8, generator=gen).to(dtype)
    v_all = torch.randn(1, 2, start + steps, 8, generator=gen).to(dtype)
    q = torch.randn(1, 6, steps, 8, generator=gen).to(dtype)
    cache.update_and_fetch(k_all[:, :, :start], v_all[:, :, :start])
    keys, values = cache.update_and_fetch(k_all[:, :, start:], v_all[:, :, start:])
    out = causal_attention(q, keys, values)
    assert out.shape == q.shape and out.dtype == dtype
    expected = reference(q, k_all, v_all, start)
    assert (out.double() - expected).abs().max().item() <= tolerance


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("start,steps", [(1, 1), (30, 1), (30, 4), (5, 8)])
def test_few_queries_cpu_path(start, steps, dtype, tolerance):
    """Decode and speculative verify on CPU: grouped float32 matmuls, the same causal rule, the
    output in the activation dtype."""
    gen = torch.Generator().manual_seed(start + steps)
    q = torch.randn(1, 6, steps, 8, generator=gen).to(dtype)
    k, v = (torch.randn(1, 2, start + steps, 8, generator=gen).to(dtype) for _ in range(2))
    out = attention.few_queries_cpu(q, k, v, start)
    assert out.dtype == dtype and out.shape == q.shape
    assert (out.double() - reference(q, k, v, start)).abs().max().item() <= tolerance
    scaled = attention.few_queries_cpu(q, k, v, start, scale=0.5)
    assert (scaled.double() - reference(q, k * (0.5 * 8**0.5), v, start)).abs().max().item() <= tolerance


@pytest.mark.parametrize("start,steps", [(0, 9), (7, 5)])
def test_lower_right_causal_path_used_on_cuda(start, steps):
    """The CUDA path's semantics and GQA expansion, run here through the CPU fallback."""
    gen = torch.Generator().manual_seed(steps)
    q = torch.randn(1, 6, steps, 8, generator=gen)
    k, v = (torch.randn(1, 2, start + steps, 8, generator=gen) for _ in range(2))
    out = lower_right_causal(q, k, v)
    assert (out.double() - reference(q, k, v, start)).abs().max().item() <= 1e-5


def test_cache_write_past_capacity_is_refused():
    cache = ModelKVCache.allocate(ARGS, 4, torch.float32, "cpu").layers[0]
    kv = torch.zeros(1, 2, 3, 8)
    cache.update_and_fetch(kv, kv)
    with pytest.raises(PromptTooLongError, match="holds 4 tokens"):
        cache.update_and_fetch(kv, kv)
    assert cache.trim(2) == 2 and cache.offset == 1
    keys, _ = cache.update_and_fetch(kv, kv)  # room again after the trim
    assert keys.shape[2] == 4


def test_prefill_takes_a_pluggable_attention_strategy():
    """What H2O's prefill plugs in: per layer, the step's post-RoPE queries and every cached key
    and value so far in, the attention output out; decode keeps full attention."""
    tiny = make_tiny("qwen3", seed=11)
    model = tiny.ours()
    ops, ids = model.ops, model.ops.tokens(np.array(prompt_ids(12, seed=11)))
    calls = []

    class Recording:
        def __call__(self, layer, q, k, v):
            calls.append((layer, tuple(q.shape), tuple(k.shape)))
            return causal_attention(q, k, v)

        def arrays(self):
            return []

        def queries_from(self, layer, steps, end):
            return 0  # sees every query, the last layer's too

    cache = ops.new_cache(model.model, 13)
    plugged = prefill(ops, model.model, ids, 0, cache, step_size=8, attend=Recording())
    assert calls == [
        (0, (1, 4, 8, 24), (1, 2, 8, 24)),
        (1, (1, 4, 8, 24), (1, 2, 8, 24)),
        (0, (1, 4, 4, 24), (1, 2, 12, 24)),
        (1, (1, 4, 4, 24), (1, 2, 12, 24)),
    ]
    torch.testing.assert_close(plugged, model(ids)[0, -1:], rtol=0, atol=1e-5)
    ops.forward(model.model, ops.tokens(np.array([3])), 12, cache, None, 0)
    assert len(calls) == 4  # decode did not go through the prefill strategy

    class Blind(Recording):  # attend to nothing: the output must change
        def __call__(self, layer, q, k, v):
            return torch.zeros_like(q)

    zeroed = prefill(ops, model.model, ids, 0, ops.new_cache(model.model, 12), step_size=2048, attend=Blind())
    assert (zeroed - plugged).abs().max().item() > 1e-2


@pytest.mark.parametrize("steps", [1, 3])
def test_windowed_few_queries_cpu_matches_masked_sdpa(steps):
    """Sliding-window decode / verify on CPU (few_queries_cpu with the window's mask) against
    masked SDPA in float64, with position gaps (SpecPrefill's kept tokens) in the cache."""
    gen = torch.Generator().manual_seed(steps)
    key_positions = torch.tensor([0, 1, 5, 9, 10, 11, 20, 21, 22][: 6 + steps])
    q_positions = key_positions[-steps:]
    q = torch.randn(1, 6, steps, 8, generator=gen)
    k, v = (torch.randn(1, 2, key_positions.numel(), 8, generator=gen) for _ in range(2))
    out = attention.windowed_attention(q, k, v, None, 4, q_positions, key_positions)
    distance = q_positions[:, None] - key_positions[None, :]
    mask = (distance >= 0) & (distance < 4)
    expected = F.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(3, 1), v.double().repeat_interleave(3, 1), attn_mask=mask
    )
    assert (out.double() - expected).abs().max().item() <= 1e-5
