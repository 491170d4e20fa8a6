"""backends/torch_cuda/walk_graph.py: H2O's batches recorded once and replayed over the layers, on the CPU.

CUDA graphs need a GPU; here the capture is a recorder whose replay reruns the recorded batch on the
static inputs and writes the recorded output tensors in place (a graph's semantics but the graph),
which checks everything but the graph itself: each layer's inputs reach the static copies, outputs
are cloned before the next replay rewrites them, memory sets and scores carry over batches, keys
part sliding and global layers and end with their batch, and a failed or differing capture turns the
graphs off without changing a result. Every comparison is bitwise: a replay runs the same operators on
the same values. scripts/gpu_session.sh times the real graphs (e2e.json `walk_graphs`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specfill.backends.torch_cuda.walk_graph import WalkGraphStats
from specfill.core.config import H2OConfig
from specfill.core.ops import Cancelled, cancellation
from specfill.core.runtime import GenerationInfo, PrefillMethod
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids


class Recorder:
    """A WalkCapture whose replay reruns the recorded batch into the recorded outputs (in place)."""

    def __init__(self, fail: Exception | None = None, perturb: bool = False) -> None:
        self.fail, self.perturb = fail, perturb
        self.captured = 0
        self.replayed = 0

    def capture(self, run, device):
        self.captured += 1
        if self.fail is not None:
            raise self.fail
        # what a capture leaves: tensors whose values only a replay writes
        outputs = [o.new_full(o.shape, float("nan") if o.is_floating_point() else -1) for o in run()]

        def replay():
            self.replayed += 1
            for recorded, fresh in zip(outputs, run()):
                recorded.copy_(fresh)
            if self.perturb:
                outputs[0].view(-1)[0] += 1

        return replay, outputs


def h2o(n_chunk=8, n_batch=32, local=2, heavy=3) -> PrefillMethod:
    config = H2OConfig(chunk_size=n_chunk, batch_size=n_batch, local=local, heavy=heavy, dense_tail=3, layers="all")
    return PrefillMethod("h2o", h2o=config)


def run_h2o(model, ids, method):
    info = GenerationInfo(record_memory=True)
    logits = model.prompt_logits(ids, method=method, info=info)
    return np.asarray(logits), info.memory_sets


def recorded(tiny, recorder, step=32):
    model = tiny.ours(step=step)
    model.ops.walk_capture, model.ops.walk_stats = recorder, WalkGraphStats()
    return model


def assert_same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert len(got[1]) == len(want[1])
    for layer_got, layer_want in zip(got[1], want[1]):
        assert len(layer_got) == len(layer_want)
        for g, w in zip(layer_got, layer_want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("arch,layers", [("llama", 4), ("gemma3", 3), ("qwen3", 3)])
def test_replayed_batches_give_the_eager_logits_and_memory_sets(arch, layers):
    tiny = make_tiny(arch, num_hidden_layers=layers) if arch != "gemma3" else make_tiny(arch)
    ids = prompt_ids(75, seed=3)  # batches [0, 32), [32, 64), [64, 75): the last partial, with the dense tail
    want = run_h2o(tiny.ours(step=32), ids, h2o())
    recorder = Recorder()
    model = recorded(tiny, recorder)
    assert_same(run_h2o(model, ids, h2o()), want)
    stats = model.ops.walk_stats
    # one recording per batch and per kind of layer (gemma3: sliding, global, sliding), the others replayed
    kinds = 2 if arch == "gemma3" else 1
    assert stats.refused is None
    assert stats.captured == recorder.captured == 3 * kinds
    assert stats.replayed == recorder.replayed - stats.captured == 3 * (layers - kinds)
    assert_same(run_h2o(model, ids, h2o()), want)  # a second prompt records anew: nothing kept across prompts
    assert stats.captured == 6 * kinds


def test_walk_graphs_are_off_on_a_cpu_and_on_by_default_on_cuda():
    tiny = make_tiny("llama")
    assert tiny.ours().ops.walk_capture is None
    from specfill.backends.torch_cuda.ops import TorchOps

    assert TorchOps(torch.device("cpu"), torch.float32, walk_graphs=True).walk_capture is not None


@pytest.mark.parametrize("recorder", [Recorder(fail=RuntimeError("capture refused")), Recorder(perturb=True)])
def test_a_failed_or_differing_capture_turns_the_graphs_off_and_changes_nothing(recorder):
    tiny = make_tiny("llama", num_hidden_layers=3)
    ids = prompt_ids(75, seed=3)
    want = run_h2o(tiny.ours(step=32), ids, h2o())
    model = recorded(tiny, recorder)
    assert_same(run_h2o(model, ids, h2o()), want)
    stats = model.ops.walk_stats
    assert stats.refused and ("capture refused" in stats.refused or "differs" in stats.refused)
    assert recorder.captured == 1 and stats.captured == stats.replayed == 0  # tried once, then as it comes
    assert_same(run_h2o(model, ids, h2o()), want)
    assert recorder.captured == 1


def test_a_key_of_none_runs_as_it_comes():
    from specfill.backends.torch_cuda.walk_graph import WalkGraphs

    ran = []
    graphs = WalkGraphs(Recorder(), WalkGraphStats())
    inputs = [torch.ones(2, 3)]
    out = graphs(None, lambda arrays: (ran.append(1) or [arrays[0] * 2], None), inputs)
    assert ran == [1] and torch.equal(out[0][0], inputs[0] * 2) and graphs.stats.captured == 0


def test_layers_with_sinks_and_soft_caps_replay_with_their_own_terms():
    """gpt-oss's sinks travel as an input of the batch (each layer its own), a soft-cap's value and the
    presence of sinks part the keys: bitwise the walk's outputs, scores and memory sets."""
    from specfill.backends.torch_cuda.ops import TorchOps
    from specfill.core.methods.h2o import H2OPrefillAttention
    from specfill.core.stages import AttentionTerms

    gen = torch.Generator().manual_seed(5)
    n_layers, n_tokens, hq, hkv, d = 6, 72, 4, 2, 16
    terms = [
        AttentionTerms(sinks=torch.randn(hq, generator=gen)),
        AttentionTerms(softcap=20.0),
        AttentionTerms(sinks=torch.randn(hq, generator=gen), softcap=20.0),
        AttentionTerms(sinks=torch.randn(hq, generator=gen)),
        AttentionTerms(softcap=20.0),
        AttentionTerms(sinks=torch.randn(hq, generator=gen), softcap=20.0),
    ]
    q, k, v = (torch.randn(n_layers, 1, h, n_tokens, d, generator=gen) for h in (hq, hkv, hkv))
    config = H2OConfig(chunk_size=8, batch_size=32, local=2, heavy=3, dense_tail=3, layers="all")
    runs = {}
    for graphed in (False, True):
        ops = TorchOps(torch.device("cpu"), torch.float32)
        if graphed:
            ops.walk_capture, ops.walk_stats = Recorder(), WalkGraphStats()
        attend = H2OPrefillAttention(ops, config, n_layers, d**-0.5, n_tokens, terms=terms)
        outs = []
        for start in range(0, n_tokens, 32):
            end = min(start + 32, n_tokens)
            outs += [attend(i, q[i][:, :, start:end], k[i][:, :, :end], v[i][:, :, :end]) for i in range(n_layers)]
        runs[graphed] = (outs, attend.carries, ops.walk_stats)
    for got, want in zip(runs[True][0], runs[False][0]):
        assert torch.equal(got, want)
    for got, want in zip(runs[True][1], runs[False][1]):
        assert torch.equal(got.scores, want.scores)
        assert all(torch.equal(a.indices, b.indices) for a, b in zip(got.memory_sets, want.memory_sets))
    stats = runs[True][2]
    assert stats.refused is None and stats.captured == 3 * 3 and stats.replayed == 3 * 3  # 3 batches x 3 kinds


def test_a_cancel_during_a_recording_stops_the_request():
    tiny = make_tiny("llama", num_hidden_layers=2)
    model = recorded(tiny, Recorder())
    calls = {"n": 0}

    def cancelled() -> bool:  # the walk checks before every chunk: cancel inside the first recording
        calls["n"] += 1
        return calls["n"] > 12

    with cancellation(cancelled), pytest.raises(Cancelled):
        run_h2o(model, prompt_ids(75, seed=3), h2o())
    assert model.ops.walk_stats.refused is None  # a cancel is not a refusal


# operators a CUDA graph capture refuses or cannot record: the host waits for the device (a value read,
# a data-dependent size), or a tensor made from host data is copied in (torch.tensor / as_tensor)
CAPTURE_BREAKERS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select", "is_nonzero"}
CAPTURE_BREAKERS |= {"equal", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim", "bincount"}
CAPTURE_BREAKERS |= {"repeat_interleave", "lift_fresh", "lift_fresh_copy"}


class _Breakers(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.removeprefix("aten::")
        masks = name == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
        )
        if name in CAPTURE_BREAKERS or masks:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


class CaptureSafety(Recorder):
    """A Recorder that watches what the recorded run does on a simulated GPU: breakers and host
    synchronisations (placement's runtime) while the batch is recorded."""

    def __init__(self, runtime) -> None:
        super().__init__()
        self.runtime, self.breakers, self.synchronized = runtime, _Breakers(), 0

    def capture(self, run, device):
        before = self.runtime.synchronized

        def watched():
            with self.breakers:
                return run()

        try:
            return super().capture(watched, device)
        finally:
            self.synchronized += self.runtime.synchronized - before


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("dense_tail", [0, 3])
def test_a_recorded_batch_never_waits_for_the_device_nor_copies_host_data_in(arch, dense_tail, monkeypatch):
    """What a CUDA graph of a batch records must not read a value back (a synchronisation fails the
    capture: every batch would then run without graphs) nor copy host data in: checked on the GPU's code
    path (the CUDA branches, Triton launches filled by their twins) for whole batches, phase 1, the walk,
    the dense tail, sliding and global layers."""
    from tests.torch_cuda.simulated_gpu import simulated

    with simulated(monkeypatch, (9, 0)) as fake:
        model = make_tiny(arch).ours(step=32)
        recorder = CaptureSafety(fake["runtime"])
        model.ops.walk_capture, model.ops.walk_stats = recorder, WalkGraphStats()
        config = H2OConfig(chunk_size=8, batch_size=32, local=2, heavy=3, dense_tail=dense_tail, layers="all")
        model.prompt_logits(prompt_ids(75, seed=3), method=PrefillMethod("h2o", h2o=config), info=GenerationInfo())
    assert model.ops.walk_stats.refused is None and recorder.captured >= 3 and recorder.replayed >= 3
    assert recorder.breakers.found == [] and recorder.synchronized == 0, (
        recorder.breakers.found,
        recorder.synchronized,
    )


@pytest.mark.parametrize("nested", [False, True], ids=["composition", "nested-composition"])
def test_the_compositions_recorded_batches_never_wait_nor_copy_host_data_in(nested, monkeypatch):
    """The same for SpecPrefill over an H2O speculator (auto's composition at 128K; its speculator's H2O pass
    is what the graphs are for), whole or nested (its deeper layers H2O-walking the subset's slots)."""
    from dataclasses import replace

    from specfill.core.config import SpecPrefillConfig
    from specfill.core.methods import speculator_depth
    from tests.methods.support import greedy
    from tests.torch_cuda.simulated_gpu import simulated

    monkeypatch.setattr(speculator_depth, "DEEP_H2O_FROM", 1)
    walk = H2OConfig(chunk_size=8, batch_size=16, local=2, heavy=2, dense_tail=4, layers="all")
    config = SpecPrefillConfig(
        keep_ratio=0.3, lookahead=3, select_chunk=4, pool_kernel=3, query_window=3, speculator_prefill=walk
    )
    config = replace(config, deep_keep=0.3, deep_from=0.5) if nested else config
    with simulated(monkeypatch, (9, 0)) as fake:
        model = make_tiny("llama", num_hidden_layers=4).ours(step=32)
        recorder = CaptureSafety(fake["runtime"])
        model.ops.walk_capture, model.ops.walk_stats = recorder, WalkGraphStats()
        info = GenerationInfo()
        method = PrefillMethod("specprefill", specprefill=config, speculator="self:3")
        greedy(model, prompt_ids(90, seed=3), 2, method, info)
    assert model.ops.walk_stats.refused is None and recorder.captured >= 3 and recorder.replayed >= 3
    assert info.kept_tokens < 90
    assert recorder.breakers.found == [] and recorder.synchronized == 0, (
        recorder.breakers.found,
        recorder.synchronized,
    )
