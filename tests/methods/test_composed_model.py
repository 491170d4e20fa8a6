"""SpecPrefill over an H2O speculator (SpecPrefillConfig.speculator_prefill) inside each backend's
model, against the NumPy reference's speculator whose prompt rows run the reference H2O layer
(core/reference/model.py, ReferenceModel.speculator_pass): the captured queries, the prompt keys,
the look-ahead and the kept positions."""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.methods import specprefill as specprefill_module
from specfill.core.methods.specprefill import run_speculator
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.core.runtime import COMPOSED, GenerationInfo, PrefillMethod
from tests.methods.support import assert_logits_close, greedy, prompt, reference_speculator, tolerance

ARCHS = ("llama", "qwen2", "qwen3")
# chunks of 8 with a memory of 4 over a 60-90 token prompt: every chunk after the first attends to
# 4 of the earlier keys, so the H2O pass differs from the dense one well beyond the tolerance
SPECULATOR_H2O = H2OConfig(chunk_size=8, batch_size=16, local=2, heavy=2, dense_tail=4, layers="all")


def composed(h2o: H2OConfig | None = SPECULATOR_H2O, speculator: str = "self:2", keep: float = 0.3) -> PrefillMethod:
    config = SpecPrefillConfig(
        keep_ratio=keep, lookahead=3, select_chunk=4, pool_kernel=3, query_window=3, speculator_prefill=h2o
    )
    return PrefillMethod("specprefill", specprefill=config, speculator=speculator)


def speculate(t, ids: list[int], h2o: H2OConfig | None, layers: int = 2):
    model, step = t.model.speculator_model(f"self:{layers}")
    return run_speculator(
        t.model.ops, model, np.array(ids), lookahead=3, stop_ids=frozenset(), step_size=step, query_window=3, h2o=h2o
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_composed_speculator_captures_what_the_reference_h2o_speculator_does(tiny, arch):
    t = tiny(arch)
    ids = prompt(60, t.args.vocab_size, seed=31)
    got = speculate(t, ids, SPECULATOR_H2O)
    queries, keys, fed = reference_speculator(t.ref, ids, 2, 3, window=3, h2o_config=SPECULATOR_H2O)
    assert got.lookahead == fed
    assert_logits_close(t, got.queries, queries, "captured queries")
    assert_logits_close(t, got.keys, keys, "prompt keys")
    dense_queries, dense_keys, _ = reference_speculator(t.ref, ids, 2, 3, window=3)
    # the H2O pass changes the second layer's keys (its input left the first H2O layer)
    assert float(np.abs(dense_keys[1] - keys[1]).max()) > 100 * tolerance(keys)
    np.testing.assert_allclose(dense_keys[0], keys[0], atol=tolerance(keys))  # layer 0's keys read no attention


@pytest.mark.parametrize("arch", ARCHS)
def test_composed_selection_equals_the_reference_and_is_named(tiny, arch):
    t = tiny(arch)
    ids = prompt(90, t.args.vocab_size, seed=32)
    method = composed()
    info = GenerationInfo()
    greedy(t.model, ids, 2, method, info)
    queries, keys, _ = reference_speculator(t.ref, ids, 2, 3, window=3, h2o_config=SPECULATOR_H2O)
    _, selection = speculative_selection(queries, keys, method.specprefill, t.ref.scale, REFERENCE, n_window=3)
    assert info.kept_positions == selection.kept.tolist()
    assert info.method == COMPOSED == method.label and 8 < info.kept_tokens < 90


def test_composed_speculator_matches_the_oracles_key_sets(tiny):
    """The same pass with the oracle's naive H2O (explicit key sets, core/reference/oracle.py) in
    place of the reference walk: what the backend captures does not hang on code it shares."""
    t = tiny("qwen3")
    ids = prompt(40, t.args.vocab_size, seed=34)
    got = speculate(t, ids, SPECULATOR_H2O)
    queries, keys, fed = reference_speculator(t.ref, ids, 2, 3, window=3, h2o_config=SPECULATOR_H2O, use_oracle=True)
    assert got.lookahead == fed
    assert_logits_close(t, got.queries, queries, "captured queries (oracle)")
    assert_logits_close(t, got.keys, keys, "prompt keys (oracle)")


def test_a_prompt_of_one_chunk_composes_to_plain_specprefill(tiny):
    """N <= S: H2O is causal attention, so the composition keeps what plain SpecPrefill keeps."""
    t = tiny("llama")
    ids = prompt(30, t.args.vocab_size, seed=33)
    one_chunk = H2OConfig(chunk_size=32, batch_size=32, local=2, heavy=2)
    infos = [GenerationInfo(), GenerationInfo()]
    assert greedy(t.model, ids, 3, composed(one_chunk), infos[0]) == greedy(t.model, ids, 3, composed(None), infos[1])
    assert infos[0].kept_positions == infos[1].kept_positions
    assert (infos[0].method, infos[1].method) == (COMPOSED, "specprefill")


@pytest.mark.parametrize("bug", ["prompt-dense", "lookahead-sparse"])
def test_a_planted_composition_bug_fails_the_reference_check(tiny, monkeypatch, bug):
    """The check above is not vacuous: a speculator whose prompt pass ignores H2O, or whose
    look-ahead steps read only their last keys instead of the full cache, captures other queries
    than the reference's."""
    t = tiny("llama")
    ids = prompt(60, t.args.vocab_size, seed=31)
    original = specprefill_module.QueryCapture.__call__

    def planted(self, layer, q, k, v):
        if bug == "prompt-dense":
            self.prompt_attend = None
        elif self.prompt_attend is None and k.shape[2] > self.first_slot:
            return self.ops.causal_step(q, k[:, :, -q.shape[2] - 7 :], v[:, :, -q.shape[2] - 7 :], self.scale)
        return original(self, layer, q, k, v)

    monkeypatch.setattr(specprefill_module.QueryCapture, "__call__", planted)
    got = speculate(t, ids, SPECULATOR_H2O)
    queries, _, _ = reference_speculator(t.ref, ids, 2, 3, window=3, h2o_config=SPECULATOR_H2O)
    with pytest.raises(AssertionError):
        assert_logits_close(t, got.queries, queries, "captured queries")
