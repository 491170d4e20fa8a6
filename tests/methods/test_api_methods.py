"""Both methods through the public API (specfill.stream_generate), on every backend."""

from __future__ import annotations

from specfill import load, stream_generate
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import greedy, prompt


def test_stream_generate_runs_h2o_and_speculative_prefill(backend, tiny_checkpoint):
    model, tokenizer = load(tiny_checkpoint("llama", "gguf"), backend=backend, dtype="float32", device="cpu")
    assert model.backend == backend
    ids = prompt(80, model.args.vocab_size, seed=13)
    stops = frozenset(tokenizer.eos_token_ids)
    h2o = H2OConfig(chunk_size=16, batch_size=32, local=4, heavy=4, dense_tail=0, layers="all")
    h2o_info = GenerationInfo(record_memory=True)
    h2o_steps = list(stream_generate(model, tokenizer, ids, 4, method="h2o", h2o=h2o, prefill_info=h2o_info))
    assert [r.token for r in h2o_steps] == greedy(model, ids, 4, PrefillMethod("h2o", h2o=h2o), stop_ids=stops)
    assert h2o_steps[-1].kept_tokens == 80 and [len(m) for m in h2o_info.memory_sets] == [4, 4]
    assert set(h2o_info.seconds) == {"prefill"}

    spec = SpecPrefillConfig(keep_ratio=0.25, lookahead=3, select_chunk=8)
    spec_info = GenerationInfo()
    spec_steps = list(
        stream_generate(
            model,
            tokenizer,
            ids,
            4,
            method="specprefill",
            specprefill=spec,
            speculator="self:1",
            prefill_info=spec_info,
        )
    )
    last = spec_steps[-1]
    assert last.prompt_tokens == 80 and last.kept_tokens == len(spec_info.kept_positions) < 80
    assert last.ttft > 0 and set(spec_info.seconds) == {"speculator", "speculator_pass", "selection", "main_prefill"}
    assert 0 < spec_info.seconds["speculator_pass"] <= spec_info.seconds["speculator"]  # the pass, look-ahead apart
    assert [r.token for r in spec_steps] == greedy(
        model, ids, 4, PrefillMethod("specprefill", specprefill=spec, speculator="self:1"), stop_ids=stops
    )


def test_a_speculator_given_as_a_path_is_loaded_on_the_same_backend(backend, tiny_checkpoint):
    """A path loads on the main model's backend; the whole tiny model scores as "self:2" does."""
    path = tiny_checkpoint("qwen3", "gguf")
    model, tokenizer = load(path, backend=backend, dtype="float32", device="cpu")
    ids = prompt(60, model.args.vocab_size, seed=14)
    spec = SpecPrefillConfig(keep_ratio=0.3, lookahead=2, select_chunk=4)
    by_path, by_self = GenerationInfo(), GenerationInfo()
    tokens = [
        r.token
        for r in stream_generate(
            model, tokenizer, ids, 3, method="specprefill", specprefill=spec, speculator=str(path), prefill_info=by_path
        )
    ]
    assert tokens == [
        r.token
        for r in stream_generate(
            model, tokenizer, ids, 3, method="specprefill", specprefill=spec, speculator="self:2", prefill_info=by_self
        )
    ]
    assert by_path.kept_positions == by_self.kept_positions and by_path.kept_tokens < 60
