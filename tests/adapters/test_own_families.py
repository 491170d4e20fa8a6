"""The project's own model and the adapter around the library's model (mlx-lm's, transformers')
agree on the five families the project has model files for: same directory, greedy tokens equal
under full prefill, H2O and SpecPrefill (fp32, CPU). The adapter side is loaded as a (model,
tokenizer) pair from the library, the own side from the directory."""

from __future__ import annotations

import pytest

from tests.adapters.support import H2O, greedy, prompt, spec

FAMILIES = ("gemma3_text", "llama", "mistral", "qwen2", "qwen3")


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_tokens_equal_between_the_own_model_and_the_adapter(backend, arch, tmp_path):
    directory = backend.save_directory(arch, tmp_path / arch, backend.FAMILIES[arch])
    own, own_tokenizer = backend.load(directory, dtype="float32", device="cpu")
    ours, tokenizer = backend.load(backend.library_pair(directory), dtype="float32", device="cpu")
    assert isinstance(own.model, backend.OwnModel) and isinstance(ours.model, backend.AdaptedModel)
    assert tokenizer.vocab_fingerprint() == own_tokenizer.vocab_fingerprint()
    ids = prompt(44, seed=11)
    for method in (None, H2O, spec(0.3)):
        args = () if method is None else (method,)
        assert greedy(ours, ids, 8, *args) == greedy(own, ids, 8, *args), f"{arch} {method}"
