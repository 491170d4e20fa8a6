"""backends/torch_cuda/decode_graph.py: static decode steps (the CUDA-graph path) on the CPU.

CUDA graphs need a GPU; here the capture is a recorder that replays by calling the captured
function on the same static buffers, which checks everything but the graph itself: the static
inputs are refilled per step, keys land in the right slots, the bucket and its mask hide unfilled
slots, offsets advance, new buckets and step widths capture anew, and setup time is kept apart.
scripts/gpu_session.sh compares real graphs with the eager path on the GPU.

Tolerance: the static step attends through one masked SDPA over the bucket where the eager CPU
path uses its own float32 few-query matmuls (attention.few_queries_cpu): same products summed in
another order, float32 rounding only (1e-4 on logits of magnitude ~10), tokens equal.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specfill.backends.torch_cuda import decode_graph
from specfill.core.ops import Cancelled
from specfill.core.runtime import Drafting, GenerationInfo, PrefillMethod, SamplingConfig
from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids


class Recorder:
    """A Capture that 'replays' by rerunning the captured function (CPU stand-in for a graph)."""

    def __init__(self) -> None:
        self.captured = 0
        self.replayed = 0

    def capture(self, run, device, cache):
        self.captured += 1
        assert cache.graphs is not None  # graphs and their pool belong to the cache they write

        def replay():
            self.replayed += 1
            return run()

        return replay


def static(model, capture) -> None:
    model.ops.static_decode = True
    model.ops.decode_graphs = decode_graph.DecodeGraphs(capture)


def greedy(model, ids, n, drafting=None, draft_model=None, info=None):
    kwargs = {} if drafting is None else {"drafting": drafting}
    return list(
        model.generate_step(
            ids,
            max_tokens=n,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=info or GenerationInfo(),
            **kwargs,
        )
    )


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3"])
def test_static_steps_give_the_eager_tokens(arch, monkeypatch):
    monkeypatch.setattr(decode_graph, "SLOT_BUCKET", 16)  # a 40-token decode crosses buckets
    tiny = make_tiny(arch)
    ids = prompt_ids(20)
    expected = greedy(tiny.ours(), ids, 40)
    model, recorder = tiny.ours(), Recorder()
    static(model, recorder)
    info = GenerationInfo()
    assert greedy(model, ids, 40, info=info) == expected
    # buckets of 16 slots: 32, 48, 64 (prompt 20 + 39 decode steps end at slot 59); bucket 48's first step is
    # captured first (its keys laid out as bucket 32's: padded), 64 = the capacity's runs eagerly once
    assert recorder.captured == 3 and recorder.replayed == 39 - 2
    assert info.decode.seconds["setup"] > 0  # the first run and capture of each bucket, kept apart


class Counting(Recorder):
    """A Recorder that also counts the static steps run outside a replay (eager first runs)."""

    def __init__(self, monkeypatch) -> None:
        super().__init__()
        self.steps = 0
        step = decode_graph.static_step

        def counted(*args):
            self.steps += 1
            return step(*args)

        monkeypatch.setattr(decode_graph, "static_step", counted)

    @property
    def eager(self) -> int:
        return self.steps - self.replayed


def test_a_new_prompts_first_step_is_captured_without_an_eager_run(monkeypatch):
    """A second prompt (a new cache: new addresses, so new graphs) of a kind run and captured before is
    captured first and replayed, no eager first run (what the first prompt's run set up is set up), and
    decodes the eager path's tokens; its setup is the capture alone."""
    tiny = make_tiny("llama")
    expected = [greedy(tiny.ours(), prompt_ids(n), 6) for n in (20, 30)]
    model = tiny.ours()
    counting = Counting(monkeypatch)
    static(model, counting)
    assert greedy(model, prompt_ids(20), 6) == expected[0]
    assert (counting.captured, counting.eager, counting.replayed) == (1, 1, 4)
    assert greedy(model, prompt_ids(30), 6) == expected[1]
    assert (counting.captured, counting.eager, counting.replayed) == (2, 1, 9)
    # prompts of 26 and 42 tokens: caches of 32 and 48 slots, a multiple of 16 (the split-key kernel's
    # other compiled variant): the first runs eagerly once, the second is captured first
    assert [greedy(model, prompt_ids(n), 6) for n in (26, 42)] == [
        greedy(tiny.ours(), prompt_ids(n), 6) for n in (26, 42)
    ]
    assert (counting.captured, counting.eager, counting.replayed) == (4, 2, 18)


def test_the_split_key_kernels_compiled_variants():
    """What a decode attention launch compiles anew for: the merge's BLOCK_S (16 up to 4K keys of 256-key
    splits, then doubling; at most 128 splits), and whether each integer argument that follows the key count
    is a multiple of 16 or 1 (Triton's specialisations)."""
    from specfill.backends.torch_cuda.kernels.decode_triton import compiled_variant

    def variant(n):  # the 8B's decode step: 4 folded rows a KV head, 128-wide values
        return compiled_variant(n, 4, 128, torch.bfloat16)

    assert [variant(n)[0] for n in (1000, 4096, 8192, 9216, 16384, 131072, 131016)] == [16, 16, 32, 64, 64, 128, 128]
    assert variant(8192) != variant(7168)  # 32 splits of 256 keys, and 28: the merge's count a multiple of 16 or not
    assert variant(8192) != variant(8200)  # 8,200 keys: not a multiple of 16 (and 33 splits)
    assert variant(9216) == variant(10240)  # 36 and 40 splits: neither a multiple of 16, both x 4 rows
    assert variant(256)[1][2] == (False, True)  # one split: Triton makes a count of 1 a constant


def test_a_failed_first_capture_runs_the_step_eagerly_and_stops_capturing_first(caplog, monkeypatch):
    """A capture without an eager run before it that fails (on a GPU: a kernel compiled for a new size class
    inside the capture) runs the step eagerly and captures after, as a new kind does; later prompts run
    eagerly first again, and the tokens are the eager path's all along."""

    class FailingOnce(Counting):
        def capture(self, run, device, cache):
            if self.captured == 1:
                self.captured += 1
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().capture(run, device, cache)

    tiny = make_tiny("llama")
    expected = [greedy(tiny.ours(), prompt_ids(n), 6) for n in (20, 30, 24)]
    model = tiny.ours()
    failing = FailingOnce(monkeypatch)
    static(model, failing)
    with caplog.at_level("INFO", logger="specfill.backends.torch_cuda"):
        assert [greedy(model, prompt_ids(n), 6) for n in (20, 30, 24)] == expected
    assert model.ops.decode_graphs.capture_first is False and not model.ops.decode_graphs.failed
    assert (failing.captured, failing.eager) == (4, 3)  # 20: run, capture; 30: failed, run, capture; 24: run, capture
    assert any("run eagerly once before their capture" in r.getMessage() for r in caplog.records)


def test_static_logits_match_eager_logits():
    tiny = make_tiny("qwen3")
    ids = torch.tensor(prompt_ids(12))
    eager, graphed = tiny.ours(), tiny.ours()
    static(graphed, Recorder())
    caches = [m.ops.new_cache(m.model, 32) for m in (eager, graphed)]
    for m, cache in zip((eager, graphed), caches):
        m.ops.forward(m.model, ids, 0, cache, None, None)
    for step, token in enumerate([5, 9, 77, 3]):
        one = torch.tensor([token])
        a = eager.ops.forward(eager.model, one, 12 + step, caches[0], None, 0)
        b = graphed.ops.forward(graphed.model, one, 12 + step, caches[1], None, 0)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)
    assert caches[1].filled == 16 and caches[1].graphs
    torch.testing.assert_close(caches[1].k[:, :, :, :16], caches[0].k[:, :, :, :16], rtol=0, atol=1e-5)


def test_drafting_verify_steps_take_the_static_path():
    tiny = make_tiny("llama")
    ids = prompt_ids(16)
    draft = make_tiny("llama", seed=1).ours()
    plain = greedy(tiny.ours(), ids, 24)
    model, recorder = tiny.ours(), Recorder()
    static(model, recorder)
    drafting = Drafting(model=draft, num_tokens=3, adaptive=False)
    assert greedy(model, ids, 24, drafting=drafting) == plain  # greedy drafting: the plain tokens
    assert recorder.captured >= 2  # a verify width (k + 1 rows) beside the one-token step


def test_prompts_and_full_caches_take_the_eager_path():
    tiny = make_tiny("llama")
    model = tiny.ours()
    static(model, Recorder())
    cache = model.ops.new_cache(model.model, 20)
    model.ops.forward(model.model, torch.tensor(prompt_ids(19)), 0, cache, None, -1)
    assert not cache.graphs  # a 19-token prompt step is no decode step
    model.ops.forward(model.model, torch.tensor([1]), 19, cache, None, 0)
    assert cache.graphs and cache.filled == 20
    from specfill.core.errors import PromptTooLongError

    with pytest.raises(PromptTooLongError, match="holds 20 tokens"):
        model.ops.forward(model.model, torch.tensor([1]), 20, cache, None, 0)


def test_cpu_default_is_the_eager_path():
    model = make_tiny("llama").ours()
    assert model.ops.static_decode is False and model.ops.decode_graphs is None
    assert model.ops.decode_setup_seconds() == 0.0


def test_the_static_step_traces_as_one_graph():
    """torch.compile needs the whole step in one graph (no per-layer ContextVar reads or host syncs)."""
    import torch._dynamo

    tiny = make_tiny("gemma3")  # windows, sandwich norms, query-key norms
    model = tiny.ours()
    cache = model.ops.new_cache(model.model, 64)
    model.ops.forward(model.model, torch.tensor(prompt_ids(12)), 0, cache, None, None)
    step = decode_graph._StepInputs(2, 64, torch.device("cpu"))
    step.ids.copy_(torch.tensor([5, 6]))
    step.positions.copy_(torch.tensor([12, 13]))
    step.slots.copy_(torch.tensor([12, 13]))
    cache.k[:, :, :, 12:].zero_()
    cache.v[:, :, :, 12:].zero_()
    explained = torch._dynamo.explain(decode_graph.static_step)(model.model, cache, step)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    # the cache is written only through write_slots (kept in place when compiled: an index_copy_ or
    # index_put_ there became a copy of the whole cache, and a copy back, in every step)
    targets = [
        str(node.target) for node in explained.graphs[0].graph.nodes if node.op in ("call_function", "call_method")
    ]
    layers = len(model.model.layers)
    assert sum("write_slots" in t for t in targets) == 2 * layers + 1, targets  # keys, values; positions
    assert not any("index_copy" in t or "index_put" in t or "setitem" in t for t in targets), targets


def test_compiled_steps_through_the_eager_backend_give_the_eager_tokens(monkeypatch):
    """The compiled path's plumbing (inductor itself runs on the GPU session: minutes on this CPU)."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend="eager", **kw))
    tiny = make_tiny("llama")
    ids = prompt_ids(20)
    expected = greedy(tiny.ours(), ids, 12)
    model = tiny.ours()
    model.ops.static_decode = True
    model.ops.decode_graphs = decode_graph.DecodeGraphs(Recorder(), compiled=True)
    assert model.ops.decode_graphs.step is not decode_graph.static_step
    assert greedy(model, ids, 12) == expected


def test_a_failed_capture_leaves_the_step_eager(caplog, monkeypatch):
    class Failing(Recorder):
        def capture(self, run, device, cache):
            self.captured += 1
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(decode_graph, "SLOT_BUCKET", 16)  # 16 decode steps from slot 20: buckets 32 and 48
    tiny = make_tiny("llama")
    ids = prompt_ids(20)
    expected = greedy(tiny.ours(), ids, 16)
    model, failing = tiny.ours(), Failing()
    static(model, failing)
    with caplog.at_level("WARNING", logger="specfill.backends.torch_cuda"):
        assert greedy(model, ids, 16) == expected
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "capture failed (RuntimeError" in lines[0]
    assert failing.captured == 1  # not tried again for the step's next bucket


@pytest.mark.parametrize(
    ("arch", "h2o"), [("llama", False), ("llama", True), ("mistral", False), ("gemma3", False)]
)  # windows; gemma3: q / k norms, sandwich norms; h2o: the prompt pass walked by H2O (the look-ahead is dense)
def test_the_lookahead_runs_as_static_steps_keeping_the_same_queries(arch, h2o, monkeypatch):
    """SpecPrefill's look-ahead through ModelOps.capture_step (a static step that also returns the
    scored layers' queries, replayed after its first run): the fed tokens, the captured queries and
    the cache as the eager capture's, within the static step's float32 rounding (the module doc)."""
    import numpy as np

    from specfill.core.config import H2OConfig
    from specfill.core.methods.specprefill import run_speculator

    walk = H2OConfig(chunk_size=8, batch_size=16, local=2, heavy=2, dense_tail=2) if h2o else None
    monkeypatch.setattr(decode_graph, "SLOT_BUCKET", 16)
    tiny = make_tiny(arch)
    ids = np.array(prompt_ids(30))
    eager, graphed, recorder = tiny.ours(), tiny.ours(), Recorder()
    static(graphed, recorder)
    runs = [
        run_speculator(
            m.ops, m.model, ids, lookahead=5, stop_ids=frozenset(), step_size=16, query_window=3, layers=[1], h2o=walk
        )
        for m in (eager, graphed)
    ]
    assert runs[1].lookahead == runs[0].lookahead and len(runs[0].lookahead) == 5
    # slots 30..34 of a 35-slot cache: buckets of 32 (two steps) and 35 (three), one capture each
    assert (recorder.captured, recorder.replayed) == (2, 3)
    assert runs[1].queries.shape == runs[0].queries.shape == (1, 3 + 5, 4, tiny.args.head_dim)
    torch.testing.assert_close(runs[1].queries, runs[0].queries, rtol=0, atol=1e-5)
    caches = [run.cache for run in runs]
    assert caches[0].filled == caches[1].filled == 35
    torch.testing.assert_close(caches[1].k[:, :, :, :35], caches[0].k[:, :, :, :35], rtol=0, atol=1e-5)


@pytest.mark.parametrize("deep_from", [None, 1], ids=["ranked", "deep-scored"])
def test_a_nested_lookahead_runs_as_static_steps_over_each_layers_slots(deep_from, monkeypatch):
    """A nested speculator (deep_keep): its first layer holds every prompt slot and the deeper one a
    subset, so one static step writes and reads two runs of slots; the fed tokens, the captured queries
    (the deeper scored layer's too, deep_from) and every layer's offset as the eager nested step's."""
    import numpy as np

    from specfill.core.config import SpecPrefillConfig
    from specfill.core.methods.specprefill import run_speculator

    monkeypatch.setattr(decode_graph, "SLOT_BUCKET", 16)
    tiny = make_tiny("llama")
    ids = np.array(prompt_ids(40))
    nest = SpecPrefillConfig(deep_keep=0.5, layers="all" if deep_from else "first-1", deep_from=deep_from)
    scored = [0, 1] if deep_from else [0]
    eager, graphed, recorder = tiny.ours(), tiny.ours(), Recorder()
    static(graphed, recorder)
    runs = [
        run_speculator(m.ops, m.model, ids, lookahead=4, stop_ids=frozenset(), step_size=16, layers=scored, nest=nest)
        for m in (eager, graphed)
    ]
    assert runs[0].depth == 1 and (runs[0].deep is not None) == bool(deep_from)
    offsets = [[layer.offset for layer in run.cache.layers] for run in runs]
    assert offsets[1] == offsets[0] and offsets[0][0] == 40 + 4 and offsets[0][1] < offsets[0][0]
    # every step static but, where nothing reads the deeper layers' output, the last (the first layer's alone)
    assert recorder.captured >= 1 and recorder.captured + recorder.replayed == (4 if deep_from else 3)
    assert runs[1].lookahead == runs[0].lookahead and len(runs[0].lookahead) == 4
    torch.testing.assert_close(runs[1].queries, runs[0].queries, rtol=0, atol=1e-5)
    if deep_from:
        torch.testing.assert_close(runs[1].deep.queries, runs[0].deep.queries, rtol=0, atol=1e-5)
    for a, b in zip(*(run.cache.layers for run in runs)):
        torch.testing.assert_close(b.k[:, :, : a.offset], a.k[:, :, : a.offset], rtol=0, atol=1e-5)


def test_a_lookahead_with_attention_terms_or_compiled_steps_keeps_the_eager_capture():
    """capture_step is asked only where the capture's look-ahead is a plain causal step, and answers
    only where its steps are not compiled (a new bucket, a new compilation, with every prompt length)."""
    from specfill.core.methods.capture import QueryCapture
    from specfill.core.stages import AttentionTerms

    tiny = make_tiny("llama")
    ops = tiny.ours().ops
    assert QueryCapture(ops, 2, 10, 0.25).plain
    assert not QueryCapture(ops, 2, 10, 0.25, terms=[None, AttentionTerms(softcap=30.0)]).plain
    compiled = tiny.ours().ops
    compiled.static_decode, compiled.decode_graphs = True, decode_graph.DecodeGraphs(Recorder(), compiled=True)
    cache = compiled.new_cache(tiny.ours().model, 8)
    assert compiled.capture_step(tiny.ours().model, torch.tensor([1]), 0, cache, [0]) is None


class CaptureSafety(Recorder):
    """A Recorder that watches each recorded run on a simulated GPU: capture breakers (a value read back,
    a data-dependent size, host data copied in: test_walk_graph's list) and host synchronisations."""

    def __init__(self, runtime) -> None:
        from tests.torch_cuda.test_walk_graph import _Breakers

        super().__init__()
        self.runtime, self.breakers, self.synchronized = runtime, _Breakers(), 0
        self.kept_queries = 0  # replays that returned queries too (look-ahead steps)

    def capture(self, run, device, cache):
        before = self.runtime.synchronized

        def watched():
            with self.breakers:
                out = run()
            self.kept_queries += isinstance(out, tuple)
            return out

        try:
            return super().capture(watched, device, cache)
        finally:
            self.synchronized += self.runtime.synchronized - before


@pytest.mark.parametrize("nest", [False, True], ids=["whole", "nested"])
def test_a_recorded_lookahead_or_decode_step_never_waits_nor_copies_host_data_in(nest, monkeypatch):
    """What a CUDA graph of a static step records must not read a value back nor copy host data in (the
    capture would fail and the steps run eagerly): SpecPrefill's look-ahead (whole, or nested over two runs
    of slots) and the decode after it, on the GPU's code path (the CUDA branches of a simulated GPU)."""
    from specfill.core.config import SpecPrefillConfig
    from tests.methods.support import greedy as method_greedy
    from tests.torch_cuda.simulated_gpu import simulated

    config = SpecPrefillConfig(keep_ratio=0.3, lookahead=3, select_chunk=4, pool_kernel=3, query_window=3)
    config = replace(config, deep_keep=0.5, deep_from=0.5) if nest else config
    with simulated(monkeypatch, (9, 0)) as fake:
        model = make_tiny("llama", num_hidden_layers=4).ours(step=32)
        recorder = CaptureSafety(fake["runtime"])
        static(model, recorder)
        info = GenerationInfo()
        method = PrefillMethod("specprefill", specprefill=config, speculator="self:4")
        method_greedy(model, prompt_ids(60, seed=3), 3, method, info)
    assert info.kept_tokens < 60 and recorder.captured >= 2  # a look-ahead step and a decode step
    assert recorder.kept_queries == 2  # the look-ahead's second and third steps, replayed
    assert recorder.breakers.found == [] and recorder.synchronized == 0, (
        recorder.breakers.found,
        recorder.synchronized,
    )


def test_a_self_speculator_view_is_made_once_and_shares_the_main_models_modules():
    """first_layers(K) ("self:K") is one object per K, kept: every request that names it skips the
    module building, and static steps captured for it (keyed by the model) are found again."""
    model = make_tiny("llama", num_hidden_layers=3).ours().model
    view = model.first_layers(2)
    assert model.first_layers(2) is view and model.first_layers(1) is not view
    assert list(view.layers) == list(model.layers[:2]) and view.lm_head is model.lm_head
    assert view.args.num_hidden_layers == 2 and not any(t.is_meta for t in [*view.parameters(), *view.buffers()])


def test_a_request_cancelled_inside_a_capture_leaves_the_kind_capturable(monkeypatch):
    """A cancellation seen by a layer's check while its step is being captured ends the request (Cancelled),
    and is no failure of the capture: the next request of that kind still runs in graphs."""
    from specfill.core.ops import cancellation

    class CancelledOnce(Counting):
        def capture(self, run, device, cache):
            if self.captured == 0:
                self.captured += 1
                with cancellation(lambda: True):
                    run()  # the layer's check raises, as a real capture's run would
            return super().capture(run, device, cache)

    tiny = make_tiny("llama")
    expected = greedy(tiny.ours(), prompt_ids(20), 6)
    model = tiny.ours()
    cancelling = CancelledOnce(monkeypatch)
    static(model, cancelling)
    with pytest.raises(Cancelled):
        greedy(model, prompt_ids(20), 6)
    assert not model.ops.decode_graphs.failed and model.ops.decode_graphs.capture_first
    assert greedy(model, prompt_ids(20), 6) == expected
    assert cancelling.captured == 2 and cancelling.replayed == 4
