"""H2O and SpecPrefill through the transformers adapter against the NumPy oracle, on the same weights.

H2O: the q/k/v the adapter hands to H2O at each layer (recorded on the way in) go through the
naive oracle of core/reference/oracle.py (one query at a time, explicit key sets): its memory sets
must equal the ones the run recorded, and its outputs the layer's outputs. SpecPrefill: the
speculator's queries and prompt keys recorded the same way go through the float64 reference
scoring and selection (core/reference/specprefill.py): its kept positions must equal the run's.
Model types the methods cannot honour are refused by name (model type, layer, kind, method).
"""
from __future__ import annotations

import numpy as np
import pytest

from specfill.core.adapted import MethodRefusedError
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import ModelLoadError
from specfill.core.methods.h2o import H2OPrefillAttention
from specfill.core.methods.specprefill import QueryCapture
from specfill.core.reference import REFERENCE
from specfill.core.reference.oracle import oracle_h2o_layer
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod

from tests.torch_adapter.archs import AT_LOAD, HONOURED, REFUSED, TERMS, build
from tests.torch_adapter.support import adapted, assert_close, greedy, prompt

H2O = PrefillMethod("h2o", h2o=H2OConfig(chunk_size=8, batch_size=64, local=2, heavy=3, dense_tail=0, layers="all"))


def spec(keep: float, lookahead: int = 2) -> PrefillMethod:
    return PrefillMethod("specprefill", speculator="self:1", specprefill=SpecPrefillConfig(
        keep_ratio=keep, lookahead=lookahead, select_chunk=4, pool_kernel=3))


def oracle_terms(model, layer: int) -> dict:
    """The layer's attention terms as the oracle takes them (sinks as float64 NumPy [Hq])."""
    terms = model.args.layer_terms[layer]
    if terms is None:
        return {}
    return dict(sinks=None if terms.sinks is None else terms.sinks.detach().double().numpy(), softcap=terms.softcap)


def reference_terms(model, layers) -> tuple:
    """The layers' terms with NumPy sinks, as the reference scoring takes them."""
    from specfill.core.stages import AttentionTerms

    return tuple(None if not oracle_terms(model, i) else AttentionTerms(**oracle_terms(model, i)) for i in layers)


def record(monkeypatch, cls) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Every call of cls (a PrefillAttention) as (layer, q, k, v, output), NumPy [H, T, D]."""
    calls = []
    original = cls.__call__

    def spy(self, layer, q, k, v):
        out = original(self, layer, q, k, v)
        calls.append((layer, *(a[0].float().numpy().copy() for a in (q, k, v, out))))
        return out

    monkeypatch.setattr(cls, "__call__", spy)
    return calls


@pytest.mark.parametrize("arch", sorted(HONOURED))
def test_h2o_memory_sets_and_outputs_equal_the_oracle(arch, monkeypatch):
    model = adapted(build(arch))
    ids = prompt(36, seed=7)
    calls = record(monkeypatch, H2OPrefillAttention)
    info = GenerationInfo(record_memory=True)
    logits = model.prompt_logits(ids, method=H2O, info=info)
    full = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert np.abs(logits - full).max() > 1e-3 * np.abs(full).max(), "H2O really changed the attention"
    assert [call[0] for call in calls] == [0, 1]
    config = H2O.h2o
    for layer, q, k, v, out in calls:
        want_out, want_sets, _ = oracle_h2o_layer(q, k, v, config.chunk_size, config.local, config.heavy,
                                                  model.args.attention_scale, window=model.args.layer_window(layer),
                                                  **oracle_terms(model, layer))
        assert_close(out, want_out.astype(np.float32), f"{arch} layer {layer} H2O output")
        got = info.memory_sets[layer]
        assert len(got) == len(want_sets) == 36 // 8
        for chunk, (g, w) in enumerate(zip(got, want_sets)):
            np.testing.assert_array_equal(g, np.array(w), err_msg=f"{arch} layer {layer} M_{chunk}")


@pytest.mark.parametrize("arch", sorted(HONOURED))
def test_specprefill_kept_positions_equal_the_reference_selection(arch, monkeypatch):
    model = adapted(build(arch))
    ids = prompt(48, seed=8)
    calls = record(monkeypatch, QueryCapture)
    info = GenerationInfo()
    tokens = greedy(model, ids, 3, spec(0.3), info)
    n = len(ids)
    queries = np.stack([[q[:, -1] for layer, q, k, _, _ in calls if layer == 0 and k.shape[1] >= n]])
    keys = np.stack([calls[0][2][:, :n]])  # the prefill step's keys of layer 0
    assert queries.shape[1] == 3  # the last prompt token and two look-ahead tokens
    _, selection = speculative_selection(queries.astype(np.float64), keys.astype(np.float64), spec(0.3).specprefill,
                                         model.args.attention_scale, REFERENCE, model.args.layer_windows[:1],
                                         reference_terms(model, [0]))
    assert info.kept_positions == selection.kept.tolist()
    assert 8 <= info.kept_tokens < n and info.kept_positions[-1] == n - 1
    assert len(tokens) == 3 and greedy(model, ids, 4, spec(1.0)) == greedy(model, ids, 4)


@pytest.mark.parametrize("arch", sorted(REFUSED))
@pytest.mark.parametrize("method,name", [(H2O, "H2O"), (spec(0.3), "speculator")])
def test_sparse_methods_are_refused_by_name_on_layers_they_cannot_run(arch, method, name):
    model = adapted(build(arch))
    kind = REFUSED[arch][1]
    ids = prompt(24, seed=9)
    with pytest.raises(MethodRefusedError) as refused:
        greedy(model, ids, 2, method)
    message = str(refused.value)
    assert message.startswith(f"{name}") or f"the SpecPrefill {name}" in message
    assert arch in message and "layer 0" in message and kind in message and "\n" not in message
    assert len(greedy(model, ids, 2)) == 2  # full prefill and decoding still run


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_specprefill_main_pass_runs_refused_layers_with_an_honoured_speculator(arch, monkeypatch):
    """The kept tokens at their original positions go through the refused layers' own attention
    (test_forward checks those logits against transformers at the same position_ids); the
    speculator, an honoured model of the same vocabulary, selects them as the reference does."""
    model = adapted(build(arch))
    speculator = adapted(build("qwen3_moe"))
    ids = prompt(48, seed=8)
    calls = record(monkeypatch, QueryCapture)
    method = PrefillMethod("specprefill", speculator=speculator, specprefill=spec(0.3).specprefill)
    info = GenerationInfo()
    assert len(greedy(model, ids, 3, method, info)) == 3
    layers = range(speculator.args.num_hidden_layers)  # a whole model as speculator: every layer scores
    queries = np.stack([[q[:, -1] for layer, q, k, _, _ in calls if layer == i and k.shape[1] >= len(ids)]
                        for i in layers])
    keys = np.stack([[c for c in calls if c[0] == i][0][2][:, :len(ids)] for i in layers])
    _, selection = speculative_selection(queries.astype(np.float64), keys.astype(np.float64), method.specprefill,
                                         speculator.args.attention_scale, REFERENCE, speculator.args.layer_windows)
    assert info.kept_positions == selection.kept.tolist() and 8 <= info.kept_tokens < len(ids)


@pytest.mark.parametrize("arch", TERMS)
def test_attention_terms_are_honoured_and_matter(arch, monkeypatch):
    """gpt_oss's sinks and gemma2's logit soft-cap reach every method as the layers' terms (not a
    refusal), and they matter: the oracle without them disagrees with what H2O computed."""
    model = adapted(build(arch))
    assert model.args.refusal() is None and all(t is not None for t in model.args.layer_terms)
    kinds = {layer.kind.split(" (")[0] for layer in model.args.layers}
    assert kinds == {"attention with sinks" if arch == "gpt_oss" else "attention with logit soft-capping"}
    calls = record(monkeypatch, H2OPrefillAttention)
    model.prompt_logits(prompt(36, seed=7), method=H2O, info=GenerationInfo())
    layer, q, k, v, out = calls[1]
    config = H2O.h2o
    plain, _, _ = oracle_h2o_layer(q, k, v, config.chunk_size, config.local, config.heavy, model.args.attention_scale,
                                   window=model.args.layer_window(layer))
    assert np.abs(out - plain).max() > 1e-3 * np.abs(plain).max(), f"{arch}: the terms changed nothing"


@pytest.mark.parametrize("arch", sorted(AT_LOAD))
def test_layers_the_kv_cache_cannot_hold_are_refused_at_load_by_name(arch):
    with pytest.raises(ModelLoadError) as refused:
        adapted(build(arch))
    message = str(refused.value)
    assert message.startswith(f"{arch} ") and AT_LOAD[arch][1] in message and "\n" not in message


def test_interface_arguments_the_adapter_does_not_model_refuse_the_layer_by_name():
    """A future argument of transformers' attention call (here a made-up one) is not ignored."""
    from torch import nn

    from specfill.backends.torch_cuda.adapter import layout_of

    call = (nn.Identity(), (1, 4, 2, 16), (1, 2, 2, 16), (1, 2, 2, 16), {"scaling": 0.25, "logit_bias": 1.0})
    layout = layout_of(call, None, 1e-6)
    assert layout.kind == "attention of an unknown layout (Identity)" and "logit_bias" in layout.refusal
    neutral = layout_of(call[:4] + ({"scaling": 0.25, "sliding_window": 8, "dropout": 0.0},), None, 1e-6)
    assert neutral.refusal is None and neutral.window == 8 and neutral.scale == 0.25


def test_dynamic_rope_refuses_the_sparse_methods_by_name():
    model = adapted(build("olmo2", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}))
    with pytest.raises(MethodRefusedError, match=r"^H2O cannot run on olmo2: layer 0 \(dynamic RoPE"):
        greedy(model, prompt(24, seed=9), 2, H2O)


@pytest.mark.parametrize("arch", sorted(HONOURED) + sorted(REFUSED))
def test_drafting_with_the_first_layer_gives_the_greedy_tokens(arch):
    """Speculative decoding drafts with the model's first layer ("self:1", sharing its cache) and
    trims rejected drafts: greedy tokens unchanged, on honoured and refused layers alike."""
    model = adapted(build(arch))
    ids = prompt(20, seed=12)
    assert greedy(model, ids, 10, drafting=Drafting("self:1", 3)) == greedy(model, ids, 10)


def test_the_self_check_refuses_what_the_kind_list_misses(monkeypatch):
    """A hybrid whose Mamba mixer beside the attention keeps a state between steps (falcon_h1),
    with transformers' list of cache kinds ignored: the 6-token self-check at load sees the
    adapter's two steps differ from transformers' one forward and refuses it by name."""
    from specfill.backends.torch_cuda import adapted

    monkeypatch.setattr(adapted, "check_layer_kinds", lambda text, architecture: None)
    with pytest.raises(ModelLoadError, match=r"^falcon_h1: specfill's attention does not reproduce transformers' "
                                              r"forward on a 6-token check"):
        adapted.adapt(build("falcon_h1"))
    assert adapted.adapt(build("falcon_h1"), check=False).args.architecture == "falcon_h1"  # what it would miss
