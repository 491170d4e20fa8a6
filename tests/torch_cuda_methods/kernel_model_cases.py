"""The model-level methods with the Triton kernels forced, against the same model on the twins.

Not collected by the main run: test_kernel_model.py runs this file in a subprocess, on CUDA when
there is a GPU, else under TRITON_INTERPRET=1 with CPU tensors (Triton decides at decoration time
whether it interprets). Shapes stay tiny: the interpreter runs every tile in NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.kernels import choose_kernel
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.driver import CausalLM
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.methods.support import greedy, prompt

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def models(tiny_checkpoint) -> tuple[CausalLM, CausalLM]:
    model, _ = load(tiny_checkpoint("qwen3", "safetensors"), dtype="float32", device=DEVICE)
    kernels, twins = (TorchOps(model.ops.device, model.ops.dtype, use) for use in (True, False))
    return CausalLM(model.model, kernels), CausalLM(model.model, twins)


def test_kernels_are_runnable_here():
    """Guards against this file silently comparing twin with twin."""
    assert choose_kernel(True, torch.zeros(1, 1, 16, device=DEVICE))


def test_h2o_with_kernels_matches_the_twins(models):
    kernels, twins = models
    ids = prompt(50, kernels.args.vocab_size, seed=11)
    method = PrefillMethod(
        "h2o", h2o=H2OConfig(chunk_size=16, batch_size=32, local=4, heavy=4, dense_tail=0, layers="all")
    )
    info_k, info_t = GenerationInfo(record_memory=True), GenerationInfo(record_memory=True)
    got = kernels.prompt_logits(ids, method=method, info=info_k)
    want = twins.prompt_logits(ids, method=method, info=info_t)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    for layer_k, layer_t in zip(info_k.memory_sets, info_t.memory_sets):
        assert len(layer_k) == len(layer_t) == 3
        for m_k, m_t in zip(layer_k, layer_t):
            np.testing.assert_array_equal(m_k, m_t)


def test_speculative_prefill_with_kernels_matches_the_twins(models):
    kernels, twins = models
    ids = prompt(60, kernels.args.vocab_size, seed=12)
    method = PrefillMethod(
        "specprefill",
        speculator="self:1",
        specprefill=SpecPrefillConfig(keep_ratio=0.3, lookahead=2, select_chunk=8, pool_kernel=3),
    )
    info_k, info_t = GenerationInfo(), GenerationInfo()
    assert greedy(kernels, ids, 3, method, info_k) == greedy(twins, ids, 3, method, info_t)
    assert info_k.kept_positions == info_t.kept_positions and info_k.kept_tokens < 60


def test_h2o_walk_graphs_replay_the_walk_bitwise(models):
    """H2O's batches recorded once and replayed over the layers (backends/torch_cuda/walk_graph.py):
    on a GPU real CUDA graphs, here the CPU recorder; the logits and memory sets bitwise the walk's."""
    from specfill.backends.torch_cuda.walk_graph import WalkGraphStats
    from tests.torch_cuda.test_walk_graph import Recorder

    kernels, _ = models
    ops = kernels.ops
    graphed = CausalLM(kernels.model, TorchOps(ops.device, ops.dtype, True, walk_graphs=True))
    plain = CausalLM(kernels.model, TorchOps(ops.device, ops.dtype, True, walk_graphs=False))
    if DEVICE == "cpu":
        graphed.ops.walk_capture, graphed.ops.walk_stats = Recorder(), WalkGraphStats()
    ids = prompt(50, kernels.args.vocab_size, seed=13)
    method = PrefillMethod(
        "h2o", h2o=H2OConfig(chunk_size=16, batch_size=32, local=4, heavy=4, dense_tail=2, layers="all")
    )
    infos = GenerationInfo(record_memory=True), GenerationInfo(record_memory=True)
    got = graphed.prompt_logits(ids, method=method, info=infos[0])
    want = plain.prompt_logits(ids, method=method, info=infos[1])
    stats = graphed.ops.walk_stats
    assert stats.refused is None
    n_layers = kernels.args.num_hidden_layers
    assert stats.captured == 2 and stats.replayed == 2 * (n_layers - 1)  # batches [0, 32) and [32, 50)
    np.testing.assert_array_equal(got, want)
    for layer_g, layer_w in zip(*(info.memory_sets for info in infos)):
        for m_g, m_w in zip(layer_g, layer_w):
            np.testing.assert_array_equal(m_g, m_w)


def gpu_routing(monkeypatch) -> None:
    """In the interpreter, a one-query step routed as on a GPU (attention.one_query_cuda, the split-key
    kernel for the eager and the static step alike); on a GPU nothing to do."""
    from specfill.backends.torch_cuda import attention, attention_choice

    if DEVICE == "cpu":
        split = lambda name, q, k, v=None: attention_choice.split_decode  # noqa: E731
        monkeypatch.setattr(attention_choice, "decode_kernel", split)  # grouped_decode's, both paths' call
        few = attention.few_queries_cpu

        def routed(q, keys, values, start, scale=None, visible=None):
            if q.shape[2] == 1 and visible is None:
                return attention.one_query_cuda(q, keys, values, scale)
            return few(q, keys, values, start, scale, visible)

        monkeypatch.setattr(attention, "few_queries_cpu", routed)


def kernel_ops(model, static: bool) -> TorchOps:
    """Ops with the kernels forced, decode and look-ahead steps static or not (on a GPU captured as CUDA
    graphs; in the interpreter run uncaptured)."""
    from specfill.backends.torch_cuda import decode_graph

    ops = TorchOps(model.ops.device, model.ops.dtype, True)
    ops.static_decode = static
    if static and DEVICE == "cpu":
        ops.decode_graphs = decode_graph.DecodeGraphs(None)
    return ops


@pytest.mark.parametrize("dtype", ["float32"] + (["bfloat16"] if DEVICE == "cuda" else []))
def test_eager_decode_logits_are_the_replayed_steps_bitwise(tiny_checkpoint, dtype, monkeypatch):
    """A decode step computes the same logits layer by layer as a static step (decode_graph.py; on a GPU
    captured and replayed): they differ only in the attention call, and the eager one on a GPU is the
    static step's own (attention.one_query_cuda). Here in the interpreter the GPU's routing is forced (a
    one-query step through one_query_cuda, the split-key kernel for both); on a GPU as it runs, with
    CUDA graphs, float32 and bfloat16 (where torch's one-query SDPA had parted the greedy tokens)."""
    from specfill.core.runtime import SamplingConfig

    gpu_routing(monkeypatch)
    model, _ = load(tiny_checkpoint("qwen3", "safetensors"), dtype=dtype, device=DEVICE)
    logits = {}
    for static in (False, True):
        ops = kernel_ops(model, static)
        seen: list[torch.Tensor] = []
        hook = model.model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out[0, -1].detach().clone()))
        try:
            steps = CausalLM(model.model, ops).generate_step(
                prompt(37, model.args.vocab_size, seed=17), max_tokens=6, sampling=SamplingConfig(),
                stop_ids=frozenset(), method=PrefillMethod(), info=GenerationInfo(),
            )  # fmt: skip
            tokens = [next(steps) for _ in range(6)]
        finally:
            hook.remove()
        logits[static] = (tokens, seen)
    (tokens_e, eager), (tokens_s, replayed) = logits[False], logits[True]
    assert tokens_e == tokens_s and len(eager) == len(replayed) >= 6
    for step, (a, b) in enumerate(zip(eager, replayed)):
        assert torch.equal(a, b), f"decode step {step}: max |diff| {float((a.float() - b.float()).abs().max())}"


@pytest.mark.parametrize("dtype", ["float32"] + (["bfloat16"] if DEVICE == "cuda" else []))
def test_the_replayed_lookahead_keeps_the_eager_queries_bitwise(tiny_checkpoint, dtype, monkeypatch):
    """SpecPrefill's look-ahead through ModelOps.capture_step (a static step keeping the scored layers'
    queries; on a GPU captured and replayed) against the speculator's eager capture: the same attention
    call on a GPU (attention.one_query_cuda), so the fed tokens and every kept query are bitwise the
    same. Here in the interpreter the GPU's routing is forced, as for the decode steps above."""
    from specfill.core.methods.specprefill import run_speculator

    gpu_routing(monkeypatch)
    model, _ = load(tiny_checkpoint("qwen3", "safetensors"), dtype=dtype, device=DEVICE)
    ids = np.array(prompt(37, model.args.vocab_size, seed=18))
    runs = {}
    for static in (False, True):
        ops = kernel_ops(model, static)
        runs[static] = run_speculator(
            ops, model.model, ids, lookahead=4, stop_ids=frozenset(), step_size=16, query_window=2
        )
    eager, replayed = runs[False], runs[True]
    assert replayed.lookahead == eager.lookahead and len(eager.lookahead) == 4
    kept = [key for key in replayed.cache.graphs if key[3]]  # (model, T, bucket, kept layers)
    assert kept and not eager.cache.graphs
    assert torch.equal(replayed.queries, eager.queries), float((replayed.queries - eager.queries).abs().max())


def test_the_replayed_nested_lookahead_keeps_the_eager_queries(tiny_checkpoint):
    """A nested speculator's look-ahead (deep_keep, deep_from: its deeper layer holds a subset's slots and
    is scored too) through one static step over two runs of slots, on a GPU captured and replayed, against
    the eager nested step: the same tokens, queries and deeper scores. float32, to 1e-5: the eager step
    sums the residual at the split where the static one's next norm adds it (the fused add-norm)."""
    from specfill.core.methods.specprefill import run_speculator

    model, _ = load(tiny_checkpoint("qwen3", "safetensors"), dtype="float32", device=DEVICE)
    ids = np.array(prompt(45, model.args.vocab_size, seed=19))
    nest = SpecPrefillConfig(deep_keep=0.5, layers="all", deep_from=1)
    runs = {}
    for static in (False, True):
        ops = kernel_ops(model, static)
        runs[static] = run_speculator(
            ops, model.model, ids, lookahead=3, stop_ids=frozenset(), step_size=16, layers=[0, 1], nest=nest
        )
    eager, replayed = runs[False], runs[True]
    assert replayed.lookahead == eager.lookahead and len(eager.lookahead) == 3
    assert any(len(key[2]) == 2 for key in replayed.cache.graphs)  # two runs of slots in one step
    torch.testing.assert_close(replayed.queries, eager.queries, rtol=0, atol=1e-5)
    torch.testing.assert_close(replayed.deep.queries, eager.deep.queries, rtol=0, atol=1e-5)
