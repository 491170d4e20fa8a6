"""H2O two-phase prefill inside each backend's model (layer-major, logical batches with a carry)
against the NumPy reference model's chunk-major H2O (a schedule no backend shares)."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.config import H2OConfig
from specfill.core.errors import ConfigError
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import (
    assert_logits_close,
    greedy,
    h2o_method,
    prompt,
    reference_h2o_greedy,
    tolerance,
    variant,
)

ARCHS = ("llama", "qwen2", "qwen3")  # all tiny checkpoints have 4 query heads over 2 KV heads (GQA)
# (N, S, B, L, H): partial last chunks, prompts over several logical batches, B = S, L or H zero
CASES = [(50, 16, 32, 4, 4), (37, 8, 16, 2, 3), (64, 16, 16, 8, 0), (64, 16, 64, 0, 5), (40, 16, 64, 5, 6)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n,s,b,local,heavy", CASES)
def test_h2o_logits_and_memory_sets_equal_the_chunk_major_reference(tiny, arch, n, s, b, local, heavy):
    t = tiny(arch)
    ids = prompt(n, t.args.vocab_size, seed=n + s)
    method = h2o_method(s, b, local, heavy)
    info = GenerationInfo(record_memory=True)
    ours = t.model.prompt_logits(ids, method=method, info=info)
    want, want_memory = t.ref.forward_h2o_chunk_major(ids, method.h2o)
    assert isinstance(ours, np.ndarray) and ours.dtype == np.float32 and np.isfinite(ours).all()
    assert_logits_close(t, ours, want, f"{arch} H2O N={n} S={s} B={b} L={local} H={heavy}")
    # H2O really changed the attention: full attention is far outside the tolerance
    assert np.abs(t.ref.forward(ids) - want).max() > 100 * tolerance(want)
    assert info.prompt_tokens == info.kept_tokens == n and info.kept_positions is None
    assert info.seconds["prefill"] > 0
    n_sets = -(-n // s) - 1
    assert len(info.memory_sets) == t.args.num_hidden_layers
    for layer, (got, expected) in enumerate(zip(info.memory_sets, want_memory)):
        assert len(got) == len(expected) == n_sets
        for chunk, (g, e) in enumerate(zip(got, expected)):
            assert isinstance(g, np.ndarray) and g.shape == (t.args.num_key_value_heads, local + heavy)
            np.testing.assert_array_equal(g, e.indices, err_msg=f"layer {layer} memory set M_{chunk}")


def test_memory_sets_are_only_recorded_when_asked(tiny):
    t = tiny("llama")
    info = GenerationInfo(record_memory=True)
    t.model.prompt_logits(prompt(40, t.args.vocab_size), method=h2o_method(16, 32, 4, 4), info=info)
    assert [len(sets) for sets in info.memory_sets] == [2, 2]
    t.model.prompt_logits(prompt(40, t.args.vocab_size), method=h2o_method(16, 32, 4, 4), info=GenerationInfo())
    info.record_memory = False  # a reused info object is reset by the next prefill
    t.model.prompt_logits(prompt(40, t.args.vocab_size), method=h2o_method(16, 32, 4, 4), info=info)
    assert info.memory_sets is None


@pytest.mark.parametrize("arch", ARCHS)
def test_generation_after_h2o_prefill_decodes_with_full_attention(tiny, arch):
    """Layer-major NumPy H2O prefill, then decode steps attending to every prompt position."""
    t = tiny(arch)
    ids = prompt(45, t.args.vocab_size, seed=3)
    method = h2o_method(16, 32, 4, 4)
    tokens = greedy(t.model, ids, 6, method)
    assert tokens == reference_h2o_greedy(t.ref, ids, method.h2o, 6)
    assert tokens[0] == int(t.model.prompt_logits(ids, method=method, info=GenerationInfo())[-1].argmax())


@pytest.mark.parametrize("n", [1, 9, 16])
def test_prompt_of_one_chunk_is_exactly_full_attention(tiny, n):
    t = tiny("qwen3")
    ids = prompt(n, t.args.vocab_size, seed=n)
    info = GenerationInfo(record_memory=True)
    ours = t.model.prompt_logits(ids, method=h2o_method(16, 32, 4, 4), info=info)
    np.testing.assert_array_equal(ours, t.model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo()))
    assert info.memory_sets == [[], []]
    assert greedy(t.model, ids, 5, h2o_method(16, 32, 4, 4)) == greedy(t.model, ids, 5)


def test_h2o_disabled_is_exactly_full_attention(tiny):
    t = tiny("llama")
    ids = prompt(70, t.args.vocab_size, seed=4)
    disabled = h2o_method(16, 32, 0, 0)
    full = t.model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    np.testing.assert_array_equal(t.model.prompt_logits(ids, method=disabled, info=GenerationInfo()), full)
    assert_logits_close(t, full, t.ref.forward(ids), "full attention")
    assert greedy(t.model, ids, 4, disabled) == greedy(t.model, ids, 4)


def test_progress_is_reported_per_logical_batch(tiny):
    t = tiny("qwen2")
    calls = []
    greedy(
        t.model,
        prompt(50, t.args.vocab_size),
        2,
        h2o_method(8, 16, 2, 2),
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(16, 50), (32, 50), (48, 50), (50, 50)]
    calls.clear()  # where H2O is plain attention, the model's own prefill step applies
    greedy(
        variant(t, prefill_step_size=5),
        prompt(8, t.args.vocab_size),
        1,
        h2o_method(8, 16, 2, 2),
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(5, 8), (8, 8)]


def test_default_h2o_config_when_none_is_given(tiny):
    t = tiny("llama")
    ids = prompt(30, t.args.vocab_size)  # under the default S = 1024: full attention
    ours = t.model.prompt_logits(ids, method=PrefillMethod("h2o"), info=GenerationInfo())
    np.testing.assert_array_equal(ours, t.model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo()))


def test_speculative_prefill_has_no_prompt_logits(tiny):
    t = tiny("llama")
    with pytest.raises(ConfigError, match="drops prompt tokens"):
        t.model.prompt_logits([5, 6], method=PrefillMethod("specprefill", speculator="self:1"), info=GenerationInfo())


@pytest.mark.parametrize("n,s,b,tail", [(50, 16, 32, 5), (50, 16, 16, 20), (37, 8, 16, 40)])
def test_h2o_dense_tail_equals_the_chunk_major_reference(tiny, n, s, b, tail):
    """The last W queries attend to every earlier key (tail in the last chunk, across logical
    batches, the whole prompt)."""
    t = tiny("qwen2")
    ids = prompt(n, t.args.vocab_size, seed=n + tail)
    method = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=s, batch_size=b, local=2, heavy=3, dense_tail=tail))
    ours = t.model.prompt_logits(ids, method=method, info=GenerationInfo())
    want, _ = t.ref.forward_h2o_chunk_major(ids, method.h2o)
    assert_logits_close(t, ours, want, f"H2O N={n} S={s} B={b} dense tail {tail}")


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_h2o_prefill_on_two_threads_equals_one_thread(tiny):
    """On CPU the torch twins spread their work units over torch's thread count (pool threads run
    in the model's inference mode); only the rest of the model's rounding may change with it."""
    import torch

    t = tiny("qwen2")
    ids = prompt(70, t.args.vocab_size, seed=11)
    method = h2o_method(16, 32, 4, 4)
    runs = []
    previous = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            runs.append(t.model.prompt_logits(ids, method=method, info=GenerationInfo()))
        finally:
            torch.set_num_threads(previous)
    assert_logits_close(t, runs[1], runs[0], "H2O prefill, 2 threads vs 1")
    assert_logits_close(t, runs[0], t.ref.forward_h2o_chunk_major(ids, method.h2o)[0], "H2O prefill, 1 thread")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layers,sparse", [("last-1", 1), ("first-1", 0), ("last-0.5", 1)])
def test_h2o_on_some_layers_equals_the_chunk_major_reference(tiny, arch, layers, sparse):
    """Only config.layers run H2O (memory sets there only); the others attend to every key."""
    t = tiny(arch)
    ids = prompt(50, t.args.vocab_size, seed=21)
    config = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=4, dense_tail=5, layers=layers)
    info = GenerationInfo(record_memory=True)
    ours = t.model.prompt_logits(ids, method=PrefillMethod("h2o", h2o=config), info=info)
    want, want_memory = t.ref.forward_h2o_chunk_major(ids, config)
    assert_logits_close(t, ours, want, f"{arch} H2O on layers {layers}")
    dense = 1 - sparse
    assert info.memory_sets[dense] == [] and want_memory[dense] == [] and len(info.memory_sets[sparse]) == 3
    for got, expected in zip(info.memory_sets[sparse], want_memory[sparse]):
        np.testing.assert_array_equal(got, expected.indices)
    every = t.model.prompt_logits(
        ids, method=PrefillMethod("h2o", h2o=H2OConfig(16, 32, 3, 4, 5, layers="all")), info=GenerationInfo()
    )
    full = t.model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    for other in (every, full):  # neither H2O everywhere nor nowhere
        assert np.abs(other - ours).max() > 100 * tolerance(want)


@pytest.mark.parametrize("spec", ["none", "first-0", "last-1.5", "middle-2"])
def test_a_bad_h2o_layers_spec_is_one_config_error(spec):
    with pytest.raises(ConfigError):
        H2OConfig(layers=spec)
