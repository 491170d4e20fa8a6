"""The project's own torch model and the adapter around transformers' model agree on the five
families the project has model files for: same directory (written by transformers'
save_pretrained), greedy tokens equal under full prefill, H2O and SpecPrefill (fp32, CPU). The
adapter side is loaded as a (model, tokenizer) pair from transformers, the own side from the
directory; the directory also loads by repo id from a Hugging Face cache, offline."""
from __future__ import annotations

import shutil

import pytest
import torch

from specfill.api import load as api_load
from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.adapted import AdaptedModel
from specfill.backends.torch_cuda.model import Transformer

from tests.torch_adapter.archs import save_directory
from tests.torch_adapter.support import greedy, prompt
from tests.torch_adapter.test_methods import H2O, spec

FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=8),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": {},
    "gemma3_text": dict(query_pre_attn_scalar=16, sliding_window=8, num_hidden_layers=6),  # 5 sliding, 1 global
}


def pair(directory) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_greedy_tokens_equal_between_the_own_model_and_the_adapter(arch, tmp_path):
    directory = save_directory(arch, tmp_path / arch, FAMILIES[arch])
    own, own_tokenizer = load(directory, dtype="float32", device="cpu")
    ours, tokenizer = load(pair(directory), dtype="float32", device="cpu")
    assert isinstance(own.model, Transformer) and isinstance(ours.model, AdaptedModel)
    assert tokenizer.vocab_fingerprint() == own_tokenizer.vocab_fingerprint()
    ids = prompt(44, seed=11)
    for method in (None, H2O, spec(0.3)):
        args = () if method is None else (method,)
        assert greedy(ours, ids, 8, *args) == greedy(own, ids, 8, *args), f"{arch} {method}"


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
    from specfill.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="expected a transformers model"):
        load((object(), object()), device="cpu")


def test_an_own_model_and_an_adapted_one_serve_as_each_others_speculator_and_draft(tmp_path):
    """One ops for both kinds of model: SpecPrefill with the other kind as speculator, and
    speculative decoding with the other kind as draft (same weights: drafts all accepted)."""
    from specfill.core.runtime import Drafting, PrefillMethod

    directory = save_directory("qwen3", tmp_path / "qwen3", FAMILIES["qwen3"])
    own, _ = load(directory, dtype="float32", device="cpu")
    ours, _ = load(pair(directory), dtype="float32", device="cpu")
    ids = prompt(40, seed=5)
    for main, other in ((own, ours), (ours, own)):
        method = PrefillMethod("specprefill", speculator=other, specprefill=spec(0.3).specprefill)
        assert greedy(main, ids, 4, method) == greedy(other, ids, 4, method.__class__(
            "specprefill", speculator=main, specprefill=method.specprefill))
        assert greedy(main, ids, 8, drafting=Drafting(other, 3)) == greedy(main, ids, 8)
