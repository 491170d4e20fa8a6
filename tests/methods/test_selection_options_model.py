"""Issue 24's options inside each backend's model: SpecPrefill's max over the look-ahead, mass
rule and neighbours select what the NumPy reference selects from the reference speculator;
H2O's memory_share runs exactly the L and H it resolves to, as the chunk-major reference does."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import assert_logits_close, greedy, prompt, reference_speculator

CONFIGS = {
    "lookahead=max": SpecPrefillConfig(
        keep_ratio=0.3, lookahead=3, select_chunk=8, pool_kernel=3, lookahead_reduction="max"
    ),
    "mass=0.4": SpecPrefillConfig(
        keep_mass=0.4, mass_floor=0.1, mass_ceiling=0.6, lookahead=3, select_chunk=4, pool_kernel=3
    ),
    "neighbours=1,max": SpecPrefillConfig(
        keep_ratio=0.1, lookahead=3, select_chunk=4, pool_kernel=3, neighbours=1, lookahead_reduction="max"
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_selection_options_equal_the_reference(tiny, arch, name):
    t = tiny(arch)
    ids = prompt(90, t.args.vocab_size, seed=11)
    config = CONFIGS[name]
    info = GenerationInfo()
    greedy(t.model, ids, 1, PrefillMethod("specprefill", specprefill=config, speculator="self:1"), info)
    queries, keys, _ = reference_speculator(t.ref, ids, 1, 3)
    _, selection = speculative_selection(queries, keys, config, t.ref.scale, REFERENCE)
    assert info.kept_positions == selection.kept.tolist()


def test_max_over_the_lookahead_changes_the_selection_of_a_model(tiny):
    """The option reaches the model's scoring: on this prompt the two reductions keep different chunks."""
    t = tiny("llama")
    ids = prompt(90, t.args.vocab_size, seed=11)
    kept = []
    for how in ("mean", "max"):
        info = GenerationInfo()
        config = SpecPrefillConfig(keep_ratio=0.2, lookahead=3, select_chunk=4, pool_kernel=1, lookahead_reduction=how)
        greedy(t.model, ids, 1, PrefillMethod("specprefill", specprefill=config, speculator="self:1"), info)
        kept.append(info.kept_positions)
    assert kept[0] != kept[1]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_memory_share_runs_the_resolved_memory(tiny, arch):
    t = tiny(arch)
    ids = prompt(50, t.args.vocab_size, seed=13)
    shared = H2OConfig(16, 32, 4, 4, dense_tail=0, memory_share=0.1)  # 5 slots: L=2 (2.5 to even), H=3
    explicit = H2OConfig(16, 32, 2, 3, dense_tail=0)
    assert shared.for_prompt(len(ids)) == explicit
    info = GenerationInfo(record_memory=True)
    ours = t.model.prompt_logits(ids, method=PrefillMethod("h2o", h2o=shared), info=info)
    want, _ = t.ref.forward_h2o_chunk_major(ids, shared)
    assert_logits_close(t, ours, want, f"{arch} H2O memory_share=0.1")
    same = t.model.prompt_logits(ids, method=PrefillMethod("h2o", h2o=explicit), info=GenerationInfo())
    np.testing.assert_array_equal(ours, same)
    assert all(m.shape == (t.args.num_key_value_heads, 5) for sets in info.memory_sets for m in sets)
