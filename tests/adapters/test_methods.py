"""H2O and SpecPrefill through the adapter against the NumPy oracle, on the same weights.

H2O: the q/k/v the adapter hands to H2O at each layer (recorded on the way in) go through the
naive oracle of core/reference/oracle.py (one query at a time, explicit key sets): its memory sets
must equal the ones the run recorded, and its outputs the layer's outputs. SpecPrefill: the
speculator's queries and prompt keys recorded the same way go through the float64 reference
scoring and selection (core/reference/specprefill.py): its kept positions must equal the run's.
Architectures the methods cannot honour are refused by name (architecture, layer, kind, method).
"""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.adapted import MethodRefusedError
from specfill.core.methods.h2o import H2OPrefillAttention
from specfill.core.methods.specprefill import QueryCapture
from specfill.core.reference import REFERENCE
from specfill.core.reference.oracle import oracle_h2o_layer
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod
from tests.adapters.support import H2O, assert_close, greedy, prompt, record, spec


def oracle_terms(backend, model, layer: int) -> dict:
    """The layer's attention terms as the oracle takes them (sinks as float64 NumPy [Hq])."""
    terms = model.args.layer_terms[layer]
    if terms is None:
        return {}
    sinks = None if terms.sinks is None else backend.to_numpy(terms.sinks).astype(np.float64)
    return dict(sinks=sinks, softcap=terms.softcap)


def reference_terms(backend, model, layers) -> tuple:
    """The layers' terms with NumPy sinks, as the reference scoring takes them."""
    from specfill.core.stages import AttentionTerms

    return tuple(
        AttentionTerms(**oracle_terms(backend, model, i)) if oracle_terms(backend, model, i) else None for i in layers
    )


@pytest.mark.archs("honoured")
def test_h2o_memory_sets_and_outputs_equal_the_oracle(backend, arch, monkeypatch):
    model = backend.adapted(backend.build(arch))
    ids = prompt(36, seed=7)
    calls = record(monkeypatch, H2OPrefillAttention, backend.to_numpy)
    info = GenerationInfo(record_memory=True)
    logits = model.prompt_logits(ids, method=H2O, info=info)
    full = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert np.abs(logits - full).max() > 1e-3 * np.abs(full).max(), "H2O really changed the attention"
    assert [call[0] for call in calls] == [0, 1]
    config = H2O.h2o
    for layer, q, k, v, out in calls:
        want_out, want_sets, _ = oracle_h2o_layer(
            q,
            k,
            v,
            config.chunk_size,
            config.local,
            config.heavy,
            model.args.attention_scale,
            window=model.args.layer_window(layer),
            **oracle_terms(backend, model, layer),
        )
        assert_close(out, want_out.astype(np.float32), f"{arch} layer {layer} H2O output")
        got = info.memory_sets[layer]
        assert len(got) == len(want_sets) == 36 // 8
        for chunk, (g, w) in enumerate(zip(got, want_sets)):
            np.testing.assert_array_equal(g, np.array(w), err_msg=f"{arch} layer {layer} M_{chunk}")


@pytest.mark.archs("honoured")
def test_specprefill_kept_positions_equal_the_reference_selection(backend, arch, monkeypatch):
    model = backend.adapted(backend.build(arch))
    ids = prompt(48, seed=8)
    calls = record(monkeypatch, QueryCapture, backend.to_numpy)
    info = GenerationInfo()
    tokens = greedy(model, ids, 3, spec(0.3), info)
    n = len(ids)
    queries = np.stack([[q[:, -1] for layer, q, k, _, _ in calls if layer == 0 and k.shape[1] >= n]])
    keys = np.stack([calls[0][2][:, :n]])  # the prefill step's keys of layer 0
    assert queries.shape[1] == 3  # the last prompt token and two look-ahead tokens
    _, selection = speculative_selection(
        queries.astype(np.float64),
        keys.astype(np.float64),
        spec(0.3).specprefill,
        model.args.attention_scale,
        REFERENCE,
        model.args.layer_windows[:1],
        reference_terms(backend, model, [0]),
    )
    assert info.kept_positions == selection.kept.tolist()
    assert 8 <= info.kept_tokens < n and info.kept_positions[-1] == n - 1
    assert len(tokens) == 3 and greedy(model, ids, 4, spec(1.0)) == greedy(model, ids, 4)


@pytest.mark.archs("refused")
def test_sparse_methods_are_refused_by_name_on_layers_they_cannot_run(backend, arch, refusal):
    """refusal: "H2O", "speculator" (SpecPrefill with the model as its own speculator) and, on MLX,
    "SpecPrefill" (an honoured speculator of the same vocabulary: the main model refuses)."""
    model = backend.adapted(backend.build(arch))
    kind = backend.REFUSED[arch][1]
    ids = prompt(24, seed=9)
    method = H2O if refusal == "H2O" else spec(0.3)
    if refusal == "SpecPrefill":
        method = PrefillMethod(
            "specprefill", speculator=backend.adapted(backend.build("qwen3_moe")), specprefill=method.specprefill
        )
    with pytest.raises(MethodRefusedError) as refused:
        greedy(model, ids, 2, method)
    message = str(refused.value)
    assert message.startswith(f"{refusal}") or f"the SpecPrefill {refusal}" in message
    assert arch in message and "layer 0" in message and kind in message and "\n" not in message
    assert len(greedy(model, ids, 2)) == 2  # full prefill and decoding still run


@pytest.mark.archs("terms")
def test_attention_terms_are_honoured_and_matter(backend, arch, monkeypatch):
    """gpt_oss's sinks and gemma2's logit soft-cap reach every method as the layers' terms (not a
    refusal), and they matter: the oracle without them disagrees with what H2O computed."""
    model = backend.adapted(backend.build(arch))
    assert model.args.refusal() is None and all(t is not None for t in model.args.layer_terms)
    kinds = {layer.kind.split(" (")[0] for layer in model.args.layers}
    assert kinds == {"attention with sinks" if arch == "gpt_oss" else "attention with logit soft-capping"}
    calls = record(monkeypatch, H2OPrefillAttention, backend.to_numpy)
    model.prompt_logits(prompt(36, seed=7), method=H2O, info=GenerationInfo())
    layer, q, k, v, out = calls[1]
    config = H2O.h2o
    plain, _, _ = oracle_h2o_layer(
        q,
        k,
        v,
        config.chunk_size,
        config.local,
        config.heavy,
        model.args.attention_scale,
        window=model.args.layer_window(layer),
    )
    assert np.abs(out - plain).max() > 1e-3 * np.abs(plain).max(), f"{arch}: the terms changed nothing"


@pytest.mark.archs("latent")
def test_latent_attention_reaches_the_methods_with_values_narrower_than_keys(backend, arch, monkeypatch):
    """deepseek_v3's multi-head latent attention runs decompressed: every layer honoured, keys of
    qk_nope + qk_rope = 24 dims, values of v_head_dim = 16 (MLX caches them so; torch zero-pads
    them to 24 in its cache, and those columns stay zero through H2O), and H2O's outputs over the
    16 value dims equal the oracle's over the narrow values."""
    model = backend.adapted(backend.build(arch))
    assert model.args.refusal() is None
    assert {layer.kind.split(" (")[0] for layer in model.args.layers} == {"multi-head latent attention"}
    assert {(layer.head_dim, layer.value_dim) for layer in model.args.layers} == {(24, 16)}
    calls = record(monkeypatch, H2OPrefillAttention, backend.to_numpy)
    model.prompt_logits(prompt(36, seed=7), method=H2O, info=GenerationInfo())
    config = H2O.h2o
    for layer, q, k, v, out in calls:
        assert q.shape[-1] == k.shape[-1] == 24 and v.shape[-1] in (16, 24)
        assert not v[..., 16:].any() and not out[..., 16:].any(), "padded value columns stay zero"
        want, _, _ = oracle_h2o_layer(
            q, k, v[..., :16], config.chunk_size, config.local, config.heavy, model.args.attention_scale
        )
        assert_close(out[..., :16], want.astype(np.float32), f"{arch} layer {layer} H2O output over Dv")


@pytest.mark.archs("honoured", "refused")
def test_drafting_with_the_first_layer_gives_the_greedy_tokens(backend, arch):
    """Speculative decoding drafts with the model's first layer ("self:1", sharing its cache) and
    trims rejected drafts: greedy tokens unchanged, on honoured and refused layers alike."""
    model = backend.adapted(backend.build(arch))
    ids = prompt(20, seed=12)
    assert greedy(model, ids, 10, drafting=Drafting("self:1", 3)) == greedy(model, ids, 10)
