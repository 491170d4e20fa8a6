"""H2O from a reused prefix (docs/methods.md) on hybrid models through the adapters (mlx-lm's and
transformers'): turn 2 reuses turn 1's cache at its prompt-end mark (the recurrent state kept
there) and walks only its new tokens by H2O on the attention layers, each equal to the oracle's key
sets with prefix=P; the recurrent layers read the new tokens from the kept state."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from specfill.core.methods.h2o import H2OPrefillAttention
from specfill.core.reference.oracle import oracle_h2o_layer
from specfill.core.runtime import GenerationInfo, KVState, SamplingConfig
from tests.adapters.support import H2O, assert_close, greedy, prompt, record

CASES = [("mlx", "qwen3_5"), ("mlx", "jamba"), ("torch", "qwen3_5_text"), ("torch", "jamba")]
NEEDS = {"mlx": ("mlx", "mlx_lm"), "torch": ("torch", "transformers")}
N, P = 60, 21


def hybrid(library: str, arch: str):
    """(the four-layer hybrid as our CausalLM, its attention layers, the to-NumPy of its arrays, a
    layer's attention scale)."""
    if library == "mlx":
        from tests.adapters.mlx_backend import adapted
        from tests.adapters.test_mlx_hybrids import ATTENTION, four_layers

        model = adapted(four_layers(arch))
        return model, ATTENTION.get(arch, (1, 3)), np.array, lambda layer: model.args.attention_scale
    from tests.adapters.test_torch_hybrids import ATTENTION, four_layers
    from tests.adapters.torch_backend import adapted, to_numpy

    model = adapted(four_layers(arch))
    return model, ATTENTION.get(arch, (1, 3)), to_numpy, lambda layer: model.args.layers[layer].scale


@pytest.mark.parametrize("library,arch", CASES)
def test_a_hybrids_second_turn_walks_its_new_part_from_the_prefix(library, arch, monkeypatch):
    missing = [name for name in NEEDS[library] if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the {library} hybrids need {', '.join(missing)}")
    model, attention, to_numpy, scale = hybrid(library, arch)
    ids = prompt(N, seed=4)
    info = GenerationInfo()
    greedy(model, ids[:P], 1, info=info)  # a full prefill; the cache marks its prompt's end, slot P
    calls = record(monkeypatch, H2OPrefillAttention, to_numpy)
    second = GenerationInfo(record_memory=True)
    options = dict(sampling=SamplingConfig(), stop_ids=frozenset(), method=H2O, info=second)
    tokens = list(model.generate_step(ids, max_tokens=2, reuse=KVState(info.kv.cache, P), **options))
    assert len(tokens) == 2 and second.method == "h2o"
    assert tuple(sorted({call[0] for call in calls})) == attention  # the others run as the library's
    config = H2O.h2o
    for layer, q, k, v, out in calls:
        assert q.shape[1] == N - P and k.shape[1] == N  # the new part's queries over every key
        want_out, want_sets, _ = oracle_h2o_layer(
            q, k, v, config.chunk_size, config.local, config.heavy, scale(layer), prefix=P
        )
        assert_close(out, want_out.astype(np.float32), f"{arch} layer {layer} H2O from the prefix")
        assert len(second.memory_sets[layer]) == len(want_sets) == -(-(N - P) // 8) - 1
        for chunk, (got, want) in enumerate(zip(second.memory_sets[layer], want_sets)):
            np.testing.assert_array_equal(got, np.array(want), err_msg=f"{arch} layer {layer} M_{chunk}")
