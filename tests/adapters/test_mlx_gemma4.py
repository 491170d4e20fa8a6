"""Gemma 4 (mlx-lm's gemma4_text) through the adapter, with its KV-shared layers: four layers
(sliding, full, sliding, full), the last two keeping no cache and reading layers 0's and 1's
(num_kv_shared_layers = 2), values from the key projection on the full layers (attention_k_eq_v),
an RMS norm on the values, per-layer inputs (docs/models.md, Gemma 4).

Forward and decoding equal mlx-lm's (fp32 on MLX's CPU: bitwise, as every architecture here);
H2O on a shared layer runs its own queries over the source layer's cached keys and values (the
same arrays), its memory sets chosen by its own scores, and equals the oracle; SpecPrefill scores
every layer, a shared one over its source's keys, and keeps what the reference keeps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specfill.core.adapted import MethodRefusedError
from specfill.core.methods.h2o import H2OPrefillAttention
from specfill.core.methods.specprefill import QueryCapture
from specfill.core.reference import REFERENCE
from specfill.core.reference.oracle import oracle_h2o_layer
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod
from tests.adapters.mlx_archs import BASE, HONOURED, build
from tests.adapters.mlx_backend import adapted, own_greedy, own_logits
from tests.adapters.support import H2O, assert_close, greedy, prompt, record, spec

SHARED = dict(
    HONOURED["gemma4_text"],
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=2,
)
EVEN = dict(SHARED, global_head_dim=16)  # every head 16 wide: a speculator can score every layer
SOURCES = {2: 0, 3: 1}  # a shared layer -> the layer whose cache it reads (the same layer type)


def shared_model():
    return adapted(build("gemma4_text", SHARED))


def test_the_layers_are_described_with_their_value_norm_k_eq_v_and_sources():
    layers = shared_model().args.layers
    assert [layer.kv_source for layer in layers] == [None, None, 0, 1]
    assert [layer.window for layer in layers] == [8, None, 8, None]
    assert [layer.k_eq_v for layer in layers] == [False, True, False, True]
    assert [layer.v_norm for layer in layers] == [True, True, False, False]  # a shared layer has no values
    assert all(layer.refusal is None for layer in layers)


def test_full_prefill_and_decoding_equal_mlx_lm():
    lm = build("gemma4_text", SHARED)
    ids = prompt(30, seed=3)
    want, want_tokens = own_logits(lm, ids), own_greedy(lm, ids, 8)
    model = adapted(lm)
    got = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert_close(got, want, "gemma4_text with KV-shared layers")
    assert greedy(model, ids, 8) == want_tokens
    assert greedy(model, ids, 8, drafting=Drafting("self:1", 3)) == want_tokens
    assert greedy(model, ids, 8, drafting=Drafting("self:3", 3)) == want_tokens  # a view holding shared layer 2


def test_h2o_on_a_shared_layer_runs_its_own_queries_over_the_source_keys(monkeypatch):
    model = shared_model()
    ids = prompt(36, seed=7)
    calls = record(monkeypatch, H2OPrefillAttention, np.array)
    info = GenerationInfo(record_memory=True)
    model.prompt_logits(ids, method=H2O, info=info)
    assert [call[0] for call in calls] == [0, 1, 2, 3]
    config = H2O.h2o
    for layer, q, k, v, out in calls:
        if layer in SOURCES:  # the very keys and values the source layer cached
            np.testing.assert_array_equal(k, calls[SOURCES[layer]][2])
            np.testing.assert_array_equal(v, calls[SOURCES[layer]][3])
        want_out, want_sets, _ = oracle_h2o_layer(
            q,
            k,
            v,
            config.chunk_size,
            config.local,
            config.heavy,
            model.args.attention_scale,
            window=model.args.layer_window(layer),
        )
        assert_close(out, want_out.astype(np.float32), f"gemma4_text layer {layer} H2O output")
        assert len(info.memory_sets[layer]) == len(want_sets) == 36 // 8
        for chunk, (got, want) in enumerate(zip(info.memory_sets[layer], want_sets)):
            np.testing.assert_array_equal(got, np.array(want), err_msg=f"gemma4_text layer {layer} M_{chunk}")
    # its own scores: a shared layer's memory sets are not simply its source's
    assert any(not np.array_equal(a, b) for a, b in zip(info.memory_sets[2], info.memory_sets[0])) or any(
        not np.array_equal(a, b) for a, b in zip(info.memory_sets[3], info.memory_sets[1])
    )


def test_specprefill_scores_every_layer_and_equals_the_reference(monkeypatch):
    model = adapted(build("gemma4_text", EVEN))
    ids = prompt(48, seed=8)
    calls = record(monkeypatch, QueryCapture, np.array)
    info = GenerationInfo()
    method = replace(spec(0.3), speculator="self:4")  # every layer scores, the shared ones too
    tokens = greedy(model, ids, 3, method, info)
    n, layers = len(ids), [0, 1, 2, 3]
    queries = np.stack([[q[:, -1] for i, q, k, _, _ in calls if i == layer and k.shape[1] >= n] for layer in layers])
    keys = np.stack([next(k for i, _, k, _, _ in calls if i == layer)[:, :n] for layer in layers])
    np.testing.assert_array_equal(keys[2], keys[0])
    _, selection = speculative_selection(
        queries.astype(np.float64),
        keys.astype(np.float64),
        method.specprefill,
        model.args.attention_scale,
        REFERENCE,
        model.args.layer_windows,
        (None,) * len(layers),
    )
    assert info.kept_positions == selection.kept.tolist() and 8 <= info.kept_tokens < n
    assert len(tokens) == 3
    assert greedy(model, ids, 4, replace(method, specprefill=spec(1.0).specprefill)) == greedy(model, ids, 4)


def test_prompt_cache_copies_keep_the_shared_layers_reading_their_source():
    model = shared_model()
    cache = model.ops.new_cache(model.model, 64)
    model.ops.forward(model.model, model.ops.tokens(prompt(12, seed=1)), 0, cache, None, None)
    copied = cache.copy(12)
    assert copied.layers[2].source is copied.layers[0] and copied.layers[3].source is copied.layers[1]
    assert copied.filled == 12 and copied.nbytes == sum(copied.layers[i].nbytes for i in (0, 1))
    np.testing.assert_array_equal(np.array(copied.layer_keys(2, 12)), np.array(cache.layer_keys(0, 12)))
    copied.trim(4)  # the source's trim is the shared layer's, once
    assert [layer.offset for layer in copied.layers] == [8, 8, 8, 8]


def test_a_saved_cache_with_wider_layers_loads_back(tmp_path):
    """The prompt store's file: layers of different shapes are written one array per layer; the
    loaded cache holds the same keys, its shared layers reading their sources again."""
    model = shared_model()
    cache = model.ops.new_cache(model.model, 64)
    model.ops.forward(model.model, model.ops.tokens(prompt(12, seed=1)), 0, cache, None, None)
    path = str(tmp_path / "kv.safetensors")
    cache.save(path, 10, {"slots": "10"})
    loaded = model.ops.new_cache(model.model, 64)
    assert loaded.load(path) == 10 and loaded.layers[3].source is loaded.layers[1]
    for layer in range(4):
        np.testing.assert_array_equal(np.array(loaded.layer_keys(layer, 10)), np.array(cache.layer_keys(layer, 10)))
        np.testing.assert_array_equal(
            np.array(loaded[layer].values[..., :10, :]), np.array(cache[layer].values[..., :10, :])
        )
    assert loaded[1].keys.shape[-1] == 32 and loaded[0].keys.shape[-1] == 16


def test_wider_full_attention_heads_run_h2o_and_specprefill_and_refuse_only_the_speculator():
    """Gemma 4's full-attention layers have heads global_head_dim wide (512 beside 256; here 32
    beside 16): H2O (above) and SpecPrefill's main pass run each layer on its own q/k/v; the
    speculator's scoring stacks every scored layer's queries, so a speculator with wider layers
    among its scored ones is refused, naming the layer."""
    model = shared_model()
    assert [layer.head_dim for layer in model.args.layers] == [16, 32, 16, 32]
    ids = prompt(40, seed=2)
    plain = greedy(model, ids, 4)
    keep_all = replace(spec(1.0), speculator="self:1")  # the main pass over wide and shared layers
    assert greedy(model, ids, 4, keep_all) == plain
    info = GenerationInfo()
    assert len(greedy(model, ids, 2, spec(0.3), info)) == 2 and info.kept_tokens < len(ids)
    message = r"speculator cannot run on gemma4_text: layer 1 \(attention\): its head counts or head dim differ"
    with pytest.raises(MethodRefusedError, match=message):
        greedy(model, ids, 2, replace(spec(0.3), speculator="self:4"))


def test_the_multimodal_wrapper_runs_its_text_model_the_same_way():
    """Gemma 4 checkpoints are mlx-lm's `gemma4` (the text model inside a vision / audio wrapper
    whose towers mlx-lm drops): the adapter reads its text_config and the backbone's sources."""
    lm = build("gemma4", dict(text_config={**BASE, "model_type": "gemma4_text", **SHARED}))
    ids = prompt(30, seed=3)
    want, want_tokens = own_logits(lm, ids), own_greedy(lm, ids, 6)
    model = adapted(lm)
    assert [layer.kv_source for layer in model.args.layers] == [None, None, 0, 1]
    got = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert_close(got, want, "gemma4 (wrapper) with KV-shared layers")
    assert greedy(model, ids, 6) == want_tokens
    assert greedy(model, ids, 6, replace(spec(1.0), speculator="self:1")) == want_tokens
    assert len(greedy(model, ids, 3, H2O)) == 3
