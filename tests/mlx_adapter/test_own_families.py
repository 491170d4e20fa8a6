"""The project's own model and the adapter around mlx-lm's model agree on the five families the
project has model files for: same directory, greedy tokens equal under full prefill, H2O and
SpecPrefill (fp32, MLX CPU). The adapter side is loaded as a (model, tokenizer) pair from
`mlx_lm.load`, the own side from the directory."""
from __future__ import annotations

from dataclasses import replace

import mlx_lm
import pytest

from specfill.backends.mlx import load
from specfill.backends.mlx.adapted import AdaptedModel
from specfill.backends.mlx.model import Model
from specfill.core.runtime import GenerationInfo

from tests.mlx_adapter.archs import save_directory
from tests.mlx_adapter.support import greedy, prompt
from tests.mlx_adapter.test_methods import H2O, spec

FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=None),  # mlx-lm runs Mistral as Llama: windows only from layer_types
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": {},
    "gemma3_text": dict(query_pre_attn_scalar=16, sliding_window=8, rope_local_base_freq=10000.0,
                        num_hidden_layers=6),  # mlx-lm reads the 6th layer's cache for its global mask
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_greedy_tokens_equal_between_the_own_model_and_the_adapter(arch, tmp_path):
    directory = save_directory(arch, tmp_path / arch, FAMILIES[arch])
    own, own_tokenizer = load(directory, dtype="float32", device="cpu")
    ours, tokenizer = load(mlx_lm.load(str(directory)), dtype="float32", device="cpu")
    assert isinstance(own.model, Model) and isinstance(ours.model, AdaptedModel)
    assert tokenizer.vocab_fingerprint() == own_tokenizer.vocab_fingerprint()
    ids = prompt(44, seed=11)
    for method in (None, H2O, spec(0.3)):
        args = () if method is None else (method,)
        assert greedy(ours, ids, 8, *args) == greedy(own, ids, 8, *args), f"{arch} {method}"


def test_an_own_model_speculates_for_the_adapted_model_as_for_the_own_model(tmp_path):
    """One speculator for both main-model paths (the speed bench compares their SpecPrefill): a
    specfill model run by the adapted model's ops keeps the same positions and gives the same
    tokens as under the own main model."""
    directory = save_directory("qwen2", tmp_path / "qwen2", FAMILIES["qwen2"])
    own, _ = load(directory, dtype="float32", device="cpu")
    ours, _ = load(mlx_lm.load(str(directory)), dtype="float32", device="cpu")
    method = replace(spec(0.3), speculator=own)
    ids = prompt(44, seed=5)
    infos = GenerationInfo(), GenerationInfo()
    assert greedy(ours, ids, 6, method, infos[0]) == greedy(own, ids, 6, method, infos[1])
    assert infos[0].kept_positions == infos[1].kept_positions and 8 <= infos[0].kept_tokens < 44


def test_an_adapted_speculator_for_an_own_main_model_is_refused_by_name(tmp_path):
    """The other way round the own model's ops cannot run mlx-lm's model: one ConfigError naming
    both ops and the way out, for a speculator and for a draft model, before anything runs."""
    from specfill.core.errors import ConfigError
    from specfill.core.runtime import Drafting, PrefillMethod, SamplingConfig

    directory = save_directory("qwen2", tmp_path / "qwen2", FAMILIES["qwen2"])
    own, _ = load(directory, dtype="float32", device="cpu")
    ours, _ = load(mlx_lm.load(str(directory)), dtype="float32", device="cpu")
    ids = prompt(44, seed=5)
    with pytest.raises(ConfigError, match="the speculator runs through AdaptedOps, which the main model's MLXOps"):
        greedy(own, ids, 4, replace(spec(0.3), speculator=ours))
    with pytest.raises(ConfigError, match="the draft model runs through AdaptedOps"):
        list(own.generate_step(ids, max_tokens=4, sampling=SamplingConfig(), stop_ids=frozenset(),
                               method=PrefillMethod(), info=GenerationInfo(), drafting=Drafting(ours, 2)))
