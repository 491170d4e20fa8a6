"""What only the transformers adapter has: steps at gapped position_ids against transformers' own,
the main pass of SpecPrefill through refused layers, model types refused at load (the KV cache
cannot hold their layers) and by the load-time self-check, attention-call arguments it does not
model, dynamic RoPE, `load(<directory>)` and repo ids from a Hugging Face cache, and an own model
and an adapted one serving as each other's speculator and draft (one ops for both)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from specfill.api import load as api_load
from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.adapted import AdaptedModel
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.cli.main import main
from specfill.core.adapted import MethodRefusedError
from specfill.core.errors import ModelLoadError
from specfill.core.methods.specprefill import QueryCapture
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.adapters.support import H2O, assert_close, greedy, prompt, record, spec
from tests.adapters.torch_archs import AT_LOAD, HONOURED, REFUSED, build, save_directory
from tests.adapters.torch_backend import FAMILIES, adapted, library_pair, own_logits, to_numpy

ALL = sorted(HONOURED) + sorted(REFUSED)


@pytest.mark.parametrize("arch", ALL)
def test_a_step_at_gapped_positions_equals_transformers_at_those_position_ids(arch):
    """SpecPrefill's kept tokens at their original positions: a prefill step at gapped per-token
    positions gives transformers' own logits for the same position_ids (and, where RoPE turns
    q and k, other logits than at consecutive positions). transformers slides its windows by
    slot, specfill by position (kept tokens keep their distances): windows here outspan the gaps."""
    extra = HONOURED[arch] if arch in HONOURED else REFUSED[arch][0]
    lm = build(arch, {**extra, "sliding_window": 64} if "sliding_window" in extra else None)
    ids = prompt(9, seed=3)
    positions = [0, 1, 3, 6, 7, 19, 20, 26, 30]
    model = adapted(lm)
    ops: TorchOps = model.ops
    with torch.inference_mode():
        cache = ops.new_cache(model.model, 12)
        got = ops.forward(model.model, ops.tokens(np.array(ids)), np.array(positions), cache, None, 0).numpy()
    want = own_logits(lm, ids, positions)
    assert_close(got, want, f"{arch} gapped positions")
    assert np.abs(want - own_logits(lm, ids)).max() > 1e-4, "positions reach the attention"


def test_the_adapted_model_still_runs_as_transformers_outside_specfill():
    lm = build("qwen3_moe")
    ids = prompt(10, seed=4)
    want = own_logits(lm, ids)
    model = adapted(lm)
    greedy(model, ids, 2)
    assert lm.config._attn_implementation != "specfill"
    np.testing.assert_array_equal(own_logits(lm, ids), want)


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_specprefill_main_pass_runs_refused_layers_with_an_honoured_speculator(arch, monkeypatch):
    """The kept tokens at their original positions go through the refused layers' own attention
    (the gapped-positions test checks those logits against transformers at the same position_ids);
    the speculator, an honoured model of the same vocabulary, selects them as the reference does."""
    model = adapted(build(arch))
    speculator = adapted(build("qwen3_moe"))
    ids = prompt(48, seed=8)
    calls = record(monkeypatch, QueryCapture, to_numpy)
    method = PrefillMethod("specprefill", speculator=speculator, specprefill=spec(0.3).specprefill)
    info = GenerationInfo()
    assert len(greedy(model, ids, 3, method, info)) == 3
    layers = range(speculator.args.num_hidden_layers)  # a whole model as speculator: every layer scores
    queries = np.stack(
        [[q[:, -1] for layer, q, k, _, _ in calls if layer == i and k.shape[1] >= len(ids)] for i in layers]
    )
    keys = np.stack([[c for c in calls if c[0] == i][0][2][:, : len(ids)] for i in layers])
    _, selection = speculative_selection(
        queries.astype(np.float64),
        keys.astype(np.float64),
        method.specprefill,
        speculator.args.attention_scale,
        REFERENCE,
        speculator.args.layer_windows,
    )
    assert info.kept_positions == selection.kept.tolist() and 8 <= info.kept_tokens < len(ids)


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


def test_the_self_check_refuses_what_the_kind_list_misses(monkeypatch):
    """A hybrid whose Mamba mixer beside the attention keeps a state between steps (falcon_h1),
    with transformers' list of cache kinds ignored: the 6-token self-check at load sees the
    adapter's two steps differ from transformers' one forward and refuses it by name."""
    from specfill.backends.torch_cuda import adapted as adapted_module

    monkeypatch.setattr(adapted_module, "check_layer_kinds", lambda text, architecture: None)
    with pytest.raises(
        ModelLoadError,
        match=r"^falcon_h1: specfill's attention does not reproduce transformers' "
        r"forward on a 6-token check",
    ):
        adapted_module.adapt(build("falcon_h1"))
    assert adapted_module.adapt(build("falcon_h1"), check=False).args.architecture == "falcon_h1"  # what it would miss


def test_a_family_refused_at_load_is_one_error_line(tmp_path, capsys):
    """`specfill generate --backend cuda --model <directory>` of a model type refused at load."""
    directory = save_directory("llama4_text", tmp_path / "llama4_text", AT_LOAD["llama4_text"][0])
    capsys.readouterr()  # what writing the test model printed
    code = main(
        [
            "generate",
            "--backend",
            "cuda",
            "--device",
            "cpu",
            "--model",
            str(directory),
            "--prompt",
            "The capital of France is Paris. " * 6,
            "--max-tokens",
            "4",
        ]
    )
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and "Traceback" not in err and not out.strip()
    assert len(lines) == 1 and "is chunked attention" in lines[0], err


def test_load_reads_the_directory_through_transformers(tmp_path):
    """`load(<directory>)` reads it in the dtype asked for."""
    directory = save_directory("qwen3_moe", tmp_path / "qwen3_moe")
    model, tokenizer = load(directory, dtype="float32", device="cpu")
    assert isinstance(model.model, AdaptedModel) and model.dtype == torch.float32 and tokenizer.vocab_size == 320
    ids = prompt(30, seed=6)
    with torch.no_grad():
        want = build("qwen3_moe")(torch.tensor([ids])).logits[0].numpy()
    assert_close(model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo()), want, "saved and loaded")
    assert np.isfinite(want).all()


def test_a_repo_id_in_the_hugging_face_cache_loads_through_the_adapter(tmp_path, monkeypatch):
    """owner/repo resolves to its cached snapshot (core/io/hub.py), offline; a model type without
    a specfill model file then loads through transformers."""
    snapshot = tmp_path / "hub" / "models--someone--tiny-olmoe" / "snapshots" / ("0" * 40)
    save_directory("olmoe", tmp_path / "olmoe")
    shutil.copytree(tmp_path / "olmoe", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, _ = api_load("someone/tiny-olmoe", backend="cuda", dtype="float32", device="cpu")
    assert isinstance(model.model, AdaptedModel) and model.args.architecture == "olmoe"
    assert len(greedy(model, prompt(20, seed=3), 3, H2O)) == 3


def test_a_pair_that_is_not_transformers_is_one_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="expected a transformers model"):
        load((object(), object()), device="cpu")


def test_an_own_model_and_an_adapted_one_serve_as_each_others_speculator_and_draft(tmp_path):
    """One ops for both kinds of model: SpecPrefill with the other kind as speculator, and
    speculative decoding with the other kind as draft (same weights: drafts all accepted)."""
    from specfill.core.runtime import Drafting

    directory = save_directory("qwen3", tmp_path / "qwen3", FAMILIES["qwen3"])
    own, _ = load(directory, dtype="float32", device="cpu")
    ours, _ = load(library_pair(directory), dtype="float32", device="cpu")
    ids = prompt(40, seed=5)
    for main_model, other in ((own, ours), (ours, own)):
        method = PrefillMethod("specprefill", speculator=other, specprefill=spec(0.3).specprefill)
        assert greedy(main_model, ids, 4, method) == greedy(
            other, ids, 4, method.__class__("specprefill", speculator=main_model, specprefill=method.specprefill)
        )
        assert greedy(main_model, ids, 8, drafting=Drafting(other, 3)) == greedy(main_model, ids, 8)


def test_layer_kinds_from_an_older_transformers(monkeypatch):
    """transformers before ~5.20 (the GPU image's 5.17) returns one kwargs dict for every layer and
    the config's layer types; the probe reads both (the first GPU hybrid run stopped on it)."""
    import transformers.cache_utils as cache_utils

    from specfill.backends.torch_cuda.adapted_probe import check_layer_kinds

    class Text:
        layer_types = ["linear_attention", "linear_attention", "full_attention"]
        num_hidden_layers = 3

    def old_style(config):
        return list(config.layer_types), {"number_of_states": 2}

    monkeypatch.setattr(cache_utils, "get_layer_types_and_kwargs", old_style)
    assert check_layer_kinds(Text(), "qwen3_5_text") == (["recurrent", "recurrent", "attention"], [2, 2, 2])
