"""The NumPy model oracle: full attention matches transformers; chunk-major H2O obeys the spec."""

import numpy as np
import pytest

from specfill.core import H2OConfig
from specfill.core.io.weights import load_weights
from specfill.core.reference.model import ReferenceModel
from tests.fixtures.checkpoints import write_tiny_checkpoint


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param, "safetensors", seed=3)
    return path, ReferenceModel(*load_weights(path))


def test_full_forward_matches_transformers(tiny):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path, model = tiny
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64).eval()
    ids = list(range(3, 40))
    positions = [0, 1, 2, 5, 6, 9, 10, 11] + list(range(20, 49))  # non-contiguous, as SpecPrefill feeds
    with torch.no_grad():
        want = hf(torch.tensor([ids]), position_ids=torch.tensor([positions])).logits[0].numpy()
    # transformers computes RoPE angles in float32 even in a float64 model: ~1e-6 on logits
    np.testing.assert_allclose(model.forward(ids, positions), want, rtol=0, atol=1e-5)


def test_h2o_prompt_within_one_chunk_is_full_attention(tiny):
    _, model = tiny
    ids = list(range(5, 21))
    logits, built = model.forward_h2o_chunk_major(ids, H2OConfig(16, 16, 2, 3, dense_tail=0))
    np.testing.assert_allclose(logits, model.forward(ids), rtol=0, atol=1e-12)
    assert all(sets == [] for sets in built)


def test_h2o_disabled_is_full_attention_and_enabled_differs(tiny):
    _, model = tiny
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 300, size=45)]
    off, _ = model.forward_h2o_chunk_major(ids, H2OConfig(chunk_size=8, batch_size=8, local=0, heavy=0, dense_tail=0))
    np.testing.assert_allclose(off, model.forward(ids), rtol=0, atol=1e-12)
    on, built = model.forward_h2o_chunk_major(ids, H2OConfig(8, 8, 2, 2, dense_tail=0, layers="all"))
    assert np.abs(on[:8] - off[:8]).max() < 1e-12  # the first chunk sees exactly its causal keys
    assert np.abs(on[8:] - off[8:]).max() > 1e-3  # later chunks see only memory sets
    assert [len(sets) for sets in built] == [5] * model.args.num_hidden_layers  # 6 chunks, none after the last


def test_dense_tail_changes_only_the_tail_and_covering_the_prompt_is_full_attention(tiny):
    _, model = tiny
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 300, size=45)]
    sparse, _ = model.forward_h2o_chunk_major(ids, H2OConfig(8, 8, 2, 2, dense_tail=0))
    tail, _ = model.forward_h2o_chunk_major(ids, H2OConfig(chunk_size=8, batch_size=8, local=2, heavy=2, dense_tail=11))
    np.testing.assert_allclose(tail[:34], sparse[:34], rtol=0, atol=1e-12)  # rows before N - W untouched
    assert np.abs(tail[34:] - sparse[34:]).max() > 1e-3
    whole, _ = model.forward_h2o_chunk_major(
        ids, H2OConfig(chunk_size=8, batch_size=8, local=2, heavy=2, dense_tail=45)
    )
    np.testing.assert_allclose(whole, model.forward(ids), rtol=0, atol=1e-10)
