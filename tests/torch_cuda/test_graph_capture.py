"""backends/torch_cuda/decode_graph.record and CudaGraphCapture: how a step becomes a CUDA graph.

CUDA graphs need a GPU: here torch.cuda's capture calls are a log (FakeCuda), which checks what record asks
of the device (no device synchronisation, no cache emptying; a failed capture made once more as the
torch.cuda.graph context made it) and which memory pool each of a cache's graphs takes. The GPU session's
kernel tests capture for real (scripts/gpu_session.sh).
"""

from __future__ import annotations

import pytest
import torch

from specfill.backends.torch_cuda import decode_graph
from specfill.core.ops import Cancelled


class FakeCuda:
    """torch.cuda's capture calls as a log (CUDA graphs need a GPU): what `record` asks of the device."""

    def __init__(self, failures: list[BaseException]):
        self.calls: list[str] = []
        self.failures = failures  # raised by the next captured runs, in order
        fake = self

        class Graph:
            def capture_begin(self, pool=None, capture_error_mode="global"):
                fake.calls.append(f"begin pool={pool} mode={capture_error_mode}")

            def replay(self):
                fake.calls.append("replay")

            def capture_end(self):
                fake.calls.append("end")
                if fake.failures and fake.failures[0] is None:  # a failed capture's ending fails as well
                    fake.failures.pop(0)
                    raise RuntimeError("operation failed due to a previous error during capture")

        class Stream:
            def __init__(self, device):
                pass

            def wait_stream(self, other):
                fake.calls.append("wait")

        self.CUDAGraph, self.Stream = Graph, Stream

    def stream(self, stream):
        from contextlib import nullcontext

        return nullcontext()

    def current_stream(self, device):
        return self.Stream(device)

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def empty_cache(self):
        self.calls.append("empty_cache")

    def run(self):
        self.calls.append("run")
        if self.failures:
            raise self.failures.pop(0)
        return "output"

    def graph_pool_handle(self):
        self.calls.append("new pool")
        return ("pool", self.calls.count("new pool"))


def fake_cuda(monkeypatch, failures):
    fake = FakeCuda(failures)
    for name in ("CUDAGraph", "Stream", "stream", "current_stream", "synchronize", "empty_cache", "graph_pool_handle"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_a_caches_graphs_share_its_pool_and_a_failed_first_capture_leaves_none(monkeypatch):
    """Every graph of a cache is captured in that cache's pool; where the cache's first capture fails, the
    pool (whose only graph failed, so torch releases it) is not kept: capturing into a released pool id
    trips torch's allocator, so the next capture takes a new one."""

    class Cache:
        graph_pool = None

    cache, fail = Cache(), ValueError("cannot be captured")
    fake = fake_cuda(monkeypatch, [fail, None, fail, None])
    with pytest.raises(ValueError):
        decode_graph.CudaGraphCapture().capture(fake.run, torch.device("cuda"), cache)
    assert cache.graph_pool is None
    replay = decode_graph.CudaGraphCapture().capture(fake.run, torch.device("cuda"), cache)
    assert replay() == "output" and cache.graph_pool == ("pool", 2)
    decode_graph.CudaGraphCapture().capture(fake.run, torch.device("cuda"), cache)
    assert cache.graph_pool == ("pool", 2) and fake.calls.count("new pool") == 2


def test_a_capture_neither_synchronises_nor_empties_the_allocators_cache(monkeypatch):
    """record captures on a side stream that waits for the queued work, in the pool given, without the
    torch.cuda.graph context's device synchronisation and cache emptying (a capture mid-request drained the
    queue and made the rest of the prompt cudaMalloc its blocks again)."""
    fake = fake_cuda(monkeypatch, [])
    graph, output = decode_graph.record(fake.run, torch.device("cuda"), pool="P")
    assert output == "output" and isinstance(graph, fake.CUDAGraph)
    assert fake.calls == ["wait", "begin pool=P mode=thread_local", "run", "end", "wait"]


def test_a_failed_capture_is_made_again_as_the_context_made_it(monkeypatch):
    """A capture that fails (out of memory beside the cached blocks) is ended, and made once more after a
    synchronisation with the cache emptied, as the torch.cuda.graph context made every capture; a step that
    cannot be captured fails again, with its own error (not the ending's)."""
    fake = fake_cuda(monkeypatch, [torch.cuda.OutOfMemoryError("no room"), None])
    _, output = decode_graph.record(fake.run, torch.device("cuda"))
    assert output == "output"
    assert fake.calls == ["wait", "begin pool=None mode=thread_local", "run", "end"] + [
        "synchronize",
        "empty_cache",
        "wait",
        "begin pool=None mode=thread_local",
        "run",
        "end",
        "wait",
    ]
    fake = fake_cuda(monkeypatch, [ValueError("a host read inside the capture"), None, ValueError("again"), None])
    with pytest.raises(ValueError, match="again"):
        decode_graph.record(fake.run, torch.device("cuda"))
    assert fake.calls.count("run") == 2 and fake.calls.count("empty_cache") == 1 and fake.calls[-1] == "end"
    fake = fake_cuda(monkeypatch, [Cancelled(), None])  # a cancelled request is raised at once, not captured again
    with pytest.raises(Cancelled):
        decode_graph.record(fake.run, torch.device("cuda"))
    assert fake.calls.count("run") == 1 and "empty_cache" not in fake.calls
