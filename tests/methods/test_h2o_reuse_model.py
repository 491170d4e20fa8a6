"""H2O from a reused prefix (docs/methods.md, issue 46) inside each backend's model: the cached
prefix stays as it is, the new part is walked by H2O from it (its first chunk reading the whole
prefix), decoding attends to every position. Against the NumPy walk and the oracle's key sets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.driver import CausalLM
from specfill.core.errors import ConfigError
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from tests.fixtures.reference_runs import reference_h2o_from_prefix, reference_h2o_from_prefix_greedy
from tests.methods.support import assert_logits_close, h2o_method, prompt, tolerance

ARCHS = ("llama", "qwen2", "qwen3")
# (N, P, S, B, L, H, W): the prefix off and on the grid, several logical batches, a dense tail
CASES = [
    (61, 13, 16, 32, 4, 4, 0),
    (56, 16, 8, 16, 2, 3, 0),
    (70, 21, 16, 16, 3, 5, 5),
    (45, 3, 8, 32, 0, 4, 0),
]


def new_part_logits(t, ids: list[int], prefix: int, method: PrefillMethod, info: GenerationInfo) -> np.ndarray:
    """The new tokens' logits [N - P, vocab]: the prefix prefilled densely into a cache, then the
    rest by `method` from it (CausalLM.prefill_prompt with start=P, what generate_step(reuse=...) runs).
    t: a Tiny, or a CausalLM."""
    model, ids = (t if isinstance(t, CausalLM) else t.model), np.asarray(ids)
    with model.ops.device_scope():
        cache = model.ops.new_cache(model.model, len(ids))
        model.prefill_prompt(ids[:prefix], cache, PrefillMethod(), GenerationInfo())
        return model.ops.to_numpy(model.prefill_prompt(ids, cache, method, info, logits_from=0, start=prefix))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n,p,s,b,local,heavy,tail", CASES)
def test_new_part_equals_the_reference_walk_and_the_oracle(tiny, arch, n, p, s, b, local, heavy, tail):
    t = tiny(arch)
    ids = prompt(n, t.args.vocab_size, seed=n + p)
    method = h2o_method(s, b, local, heavy)
    method = replace(method, h2o=replace(method.h2o, dense_tail=tail))
    info = GenerationInfo(record_memory=True)
    ours = new_part_logits(t, ids, p, method, info)
    want, want_sets, _, _ = reference_h2o_from_prefix(t.ref, ids, p, method.h2o)
    oracle, oracle_sets, _, _ = reference_h2o_from_prefix(t.ref, ids, p, method.h2o, use_oracle=True)
    what = f"{arch} H2O from P={p} N={n} S={s} B={b} L={local} H={heavy} W={tail}"
    assert ours.shape == (n - p, t.args.vocab_size)
    assert_logits_close(t, ours, want, what)
    assert_logits_close(t, ours, oracle, what + " (oracle)")
    # H2O really changed the new part's attention: full attention is far outside the tolerance
    assert np.abs(t.ref.forward(ids)[p:] - want).max() > 100 * tolerance(want)
    n_sets = -(-(n - p) // s) - 1
    for layer, (got, walk, naive) in enumerate(zip(info.memory_sets, want_sets, oracle_sets)):
        assert len(got) == len(walk) == len(naive) == n_sets
        for chunk, (g, w, o) in enumerate(zip(got, walk, naive)):
            assert g.shape == (t.args.num_key_value_heads, local + heavy)
            np.testing.assert_array_equal(g, w, err_msg=f"layer {layer} memory set M_{chunk}")
            np.testing.assert_array_equal(g, o, err_msg=f"layer {layer} memory set M_{chunk} (oracle)")


def test_a_new_part_of_one_chunk_is_full_attention(tiny):
    t = tiny("qwen3")
    ids = prompt(40, t.args.vocab_size, seed=5)
    info = GenerationInfo(record_memory=True)
    ours = new_part_logits(t, ids, 24, h2o_method(16, 32, 4, 4), info)
    np.testing.assert_array_equal(ours, new_part_logits(t, ids, 24, PrefillMethod(), GenerationInfo()))
    assert info.memory_sets == [[], []]


def keys(kv: KVState, slots: int) -> np.ndarray:
    """Every layer's keys of the first `slots` slots as NumPy [layers, Hkv, slots, D] (a copy)."""
    every = kv.cache.keys(slots)
    return np.array(every.float().numpy() if hasattr(every, "float") else np.asarray(every))


def run(model, ids, max_tokens, method, reuse=None, info=None, progress=None):
    info = info if info is not None else GenerationInfo()
    tokens = list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=method,
            info=info,
            reuse=reuse,
            progress=progress,
        )
    )
    return tokens, info


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_a_second_turn_runs_h2o_over_its_new_part_only(tiny, arch):
    """Turn 1 (full prefill) is cached; turn 2 reuses it and walks only its new tokens by H2O: the
    prefix's keys are untouched, the new part's keys, the memory sets and the greedy reply are the
    reference's, and decoding attends to every position."""
    t = tiny(arch)
    method = h2o_method(8, 16, 2, 3)
    first_prompt = prompt(30, t.args.vocab_size, seed=11)
    first, one = run(t.model, first_prompt, 4, PrefillMethod())
    held = one.kv.tokens  # the reply's last token fed or not (MLX overlaps)
    before = keys(one.kv, held)
    conversation = first_prompt + first + prompt(3 * 8 + 5, t.args.vocab_size, seed=12)
    conversation = conversation[: held + 3 * 8 + 5] if held < len(first_prompt) + len(first) else conversation
    seen: list[tuple[int, int]] = []
    info = GenerationInfo(record_memory=True)
    second, two = run(
        t.model,
        conversation,
        5,
        method,
        reuse=KVState(one.kv.cache, held),
        info=info,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert two.method == "h2o" and seen and seen[-1][1] == len(conversation) - held  # only the new part
    assert second == reference_h2o_from_prefix_greedy(t.ref, conversation, held, method.h2o, 5)
    after = keys(two.kv, len(conversation))
    np.testing.assert_array_equal(after[:, :, :held], before, err_msg="the reused prefix was written")
    _, want_sets, ref_keys, _ = reference_h2o_from_prefix(t.ref, conversation, held, method.h2o)
    want_keys = np.stack(ref_keys)[:, :, held:]
    err = float(np.abs(after[:, :, held:] - want_keys).max())
    assert err <= tolerance(want_keys), f"new part's keys differ by {err}"
    n_sets = -(-(len(conversation) - held) // 8) - 1
    assert [len(sets) for sets in two.memory_sets] == [n_sets] * t.args.num_hidden_layers
    for got, want in zip(two.memory_sets, want_sets):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    # (whether prefix tokens win heavy-hitter places is the scores' call: on these random models'
    # diffuse attention C_0's own tokens outscore them; conformance's PrefixNeverHeavy bug shows
    # that they can and must, where the new queries concentrate on them)
    assert two.kv.tokens in (len(conversation) + 4, len(conversation) + 5) and two.kv.position_offset == 0


def test_h2o_over_specprefill_kept_tokens_is_refused(tiny):
    t = tiny("llama")
    _, info = run(t.model, prompt(20, t.args.vocab_size), 1, PrefillMethod())
    with pytest.raises(ConfigError, match="needs a dense prefix"):
        run(t.model, prompt(40, t.args.vocab_size), 1, h2o_method(8, 16, 2, 3), reuse=KVState(info.kv.cache, 12, 4))


@pytest.mark.parametrize("arch", ("mistral", "gemma3"))
def test_sliding_layers_window_the_prefix_too(backend, arch):
    """Tiny random Mistral and Gemma 3 (window 8, spanning chunks of 4): every key set, the
    prefix's included, is intersected with the layer's window."""
    pytest.importorskip("transformers")
    from specfill.core.config import H2OConfig
    from specfill.core.reference.model import ReferenceModel
    from tests.test_sliding_window_methods import backend_model
    from tests.torch_cuda.tiny_torch_models import make_tiny

    tiny = make_tiny(arch, seed=7)
    ref = ReferenceModel(tiny.args, tiny.weights)
    ids, p = prompt(45, tiny.args.vocab_size, seed=3), 14
    config = H2OConfig(chunk_size=4, batch_size=8, local=1, heavy=2, dense_tail=3, layers="all")
    ours = new_part_logits(backend_model(tiny, backend), ids, p, PrefillMethod("h2o", h2o=config), GenerationInfo())
    want = reference_h2o_from_prefix(ref, ids, p, config)[0]
    assert np.abs(ours - want).max() <= tolerance(want)
    assert np.abs(ours - reference_h2o_from_prefix(ref, ids, p, config, use_oracle=True)[0]).max() <= tolerance(want)
    assert np.abs(ref.forward(ids)[p:] - want).max() > 100 * tolerance(want)
