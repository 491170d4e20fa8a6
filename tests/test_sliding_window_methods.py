"""H2O and speculative prefill on sliding-window models (tiny random Mistral and Gemma 3), on both
backends, against the NumPy reference model: chunk-major H2O with every key set intersected with
the layer's window, the speculator's captured queries and scores inside its windows, and the main
model's sparse prefill windowed over ORIGINAL positions."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from specfill.core.config import H2OConfig, SpecPrefillConfig  # noqa: E402
from specfill.core.methods.specprefill import run_speculator, speculative_prefill, token_importance  # noqa: E402
from specfill.core.reference import REFERENCE  # noqa: E402
from specfill.core.reference.model import ReferenceModel  # noqa: E402
from specfill.core.reference.specprefill import score_tokens  # noqa: E402
from specfill.core.runtime import GenerationInfo, PrefillMethod  # noqa: E402
from tests.fixtures.reference_runs import prompt, reference_speculator, tolerance  # noqa: E402
from tests.torch_cuda.tiny_torch_models import make_tiny  # noqa: E402


def backend_model(tiny, backend: str, step: int = 2048):
    """The tiny model's weights in our model on `backend` (float32, CPU)."""
    if backend == "cuda":
        return tiny.ours(step=step)
    mx = pytest.importorskip("mlx.core")
    from specfill.backends.mlx.loader import build_model
    from specfill.backends.mlx.ops import MLXOps
    from specfill.backends.mlx.weights import Checkpoint
    from specfill.core.driver import CausalLM

    arrays = {name: mx.array(w) for name, w in tiny.weights.items()}
    return CausalLM(build_model(Checkpoint(tiny.args, arrays, {}, "tiny")), MLXOps(mx.cpu), prefill_step_size=step)


BACKENDS = ["cuda", "mlx"]
# window 8: chunks of 16 hold it (w < S), chunks of 4 are spanned by it; a dense tail of 11
H2O_CASES = [(16, 16, 2, 3, 0), (4, 8, 1, 2, 0), (4, 4, 1, 1, 11)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
@pytest.mark.parametrize("s,b,local,heavy,tail", H2O_CASES)
def test_h2o_on_sliding_layers_equals_the_windowed_chunk_major_reference(backend, arch, s, b, local, heavy, tail):
    tiny = make_tiny(arch, seed=7)
    ref = ReferenceModel(tiny.args, tiny.weights)
    ids = prompt(41, tiny.args.vocab_size, seed=s + b)
    config = H2OConfig(chunk_size=s, batch_size=b, local=local, heavy=heavy, dense_tail=tail)
    info = GenerationInfo(record_memory=True)
    ours = backend_model(tiny, backend).prompt_logits(ids, method=PrefillMethod("h2o", h2o=config), info=info)
    want, want_memory = ref.forward_h2o_chunk_major(ids, config)
    assert np.abs(ours - want).max() <= tolerance(want)
    for got, expected in zip(info.memory_sets, want_memory):
        assert [g.tolist() for g in got] == [e.indices.tolist() for e in expected]
    # the windows matter: the same walk with global layers is another model
    unwindowed = ReferenceModel(type(tiny.args)(**{**tiny.args.__dict__, "sliding_window": None}), tiny.weights)
    assert np.abs(unwindowed.forward_h2o_chunk_major(ids, config)[0] - want).max() > 100 * tolerance(want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_speculator_scores_inside_its_windows_and_the_main_prefill_windows_original_positions(backend, arch):
    tiny = make_tiny(arch, seed=8)
    ref = ReferenceModel(tiny.args, tiny.weights)
    model = backend_model(tiny, backend, step=8)
    ids = prompt(40, tiny.args.vocab_size, seed=3)
    speculator, step = model.speculator_model("self:2")
    run = run_speculator(model.ops, speculator, np.array(ids), lookahead=3, stop_ids=frozenset(), step_size=step)
    queries, keys, fed = reference_speculator(ref, ids, 2, 3)
    assert run.lookahead == fed
    assert np.abs(model.ops.to_numpy(run.queries) - queries).max() <= tolerance(queries)
    config = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=4, pool_kernel=3)
    windows = speculator.args.layer_windows
    importance = model.ops.to_numpy(
        token_importance(model.ops, run.queries, run.keys, config, tiny.args.attention_scale, windows)
    )
    want = score_tokens(queries, keys, config, tiny.args.attention_scale, REFERENCE, windows).importance
    assert np.abs(importance - want).max() <= 1e-5
    unwindowed = score_tokens(queries, keys, config, tiny.args.attention_scale, REFERENCE).importance
    assert np.abs(unwindowed - want).max() > 1e-3
    # the main model's prefill of the kept tokens at their original positions
    result = speculative_prefill(
        model.ops,
        model.model,
        np.array(ids),
        speculator,
        config,
        stop_ids=frozenset(),
        extra_slots=4,
        step_size=8,
        speculator_step_size=step,
    )
    kept = result.selection.kept.tolist()
    expected = ref.forward([ids[i] for i in kept], kept)[-1]
    assert np.abs(model.ops.to_numpy(result.logits) - expected).max() <= tolerance(expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_an_h2o_speculator_walks_inside_its_windows_as_the_reference(backend, arch):
    """SpecPrefill over an H2O speculator on sliding layers: the speculator's H2O pass masks by its
    windows (chunks of 4 spanned by the window of 8), its look-ahead attends inside them, as the
    reference speculator whose prompt rows run the reference H2O layer."""
    tiny = make_tiny(arch, seed=9)
    ref = ReferenceModel(tiny.args, tiny.weights)
    model = backend_model(tiny, backend, step=8)
    ids = prompt(40, tiny.args.vocab_size, seed=4)
    config = H2OConfig(chunk_size=4, batch_size=8, local=1, heavy=2, dense_tail=3, layers="all")
    speculator, step = model.speculator_model("self:2")
    run = run_speculator(
        model.ops, speculator, np.array(ids), lookahead=3, stop_ids=frozenset(), step_size=step, h2o=config
    )
    queries, keys, fed = reference_speculator(ref, ids, 2, 3, h2o_config=config)
    assert run.lookahead == fed
    for got, want in ((run.queries, queries), (run.keys, keys)):
        assert np.abs(model.ops.to_numpy(got) - want).max() <= tolerance(want)
    dense_keys = reference_speculator(ref, ids, 2, 3)[1]
    assert np.abs(dense_keys[1] - keys[1]).max() > 100 * tolerance(keys)  # the H2O pass matters here
