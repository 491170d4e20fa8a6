"""H2O's walk as one CUDA graph a batch, replayed over the layers (issue #50, item 3).

A phase-2 chunk step is ~15 small launches (results/gpu/h2o_walk_ops.md) and its Python; on the H200
the walk was host-bound (2026-11-29: the composition's H2O speculator pass ~3 s at 128K where its
roofline is ~0.5 s, ~2,000 chunk steps). Within one prefill step every H2O layer walks the same
chunks with the same shapes and Python decisions: only the arrays differ (core/methods/h2o.py hands
the batch over as `run(arrays)` with a key, core/ops.WalkReplay). So the first layer of a key runs
the batch eagerly on static copies of its inputs (the real result, and the warm-up: Triton's
compilations and first-use self-checks happen there), the batch is captured as a CUDA graph over
those copies, replayed once and compared with the eager result BITWISE (the same kernels on the same
addresses and shapes; the walk's kernels are deterministic: column sums without atomics, scatters
onto distinct positions, stable sorts). Every later layer of the key copies its inputs into the
static ones (q, k, v, scores, the memory set: ~5 launches), replays (one launch) and clones the
outputs (output, scores, the batch's memory sets stacked: 3), ~9 launches where a 16K batch of
1,024-token chunks was ~230 and their Python.

A capture that fails or a replay that differs turns the graphs off for the ops object (logged once,
`WalkGraphStats.refused` says why): every later batch runs eagerly, as before, never wrong. One batch's
graphs are alive at a time (the next batch's first key frees them), each in a memory pool of its own (a
pool id is never reused: decode_graph.CudaGraphCapture's note). A cancelled request (core/ops.checkpoint) is seen
before every layer by the model; inside a replayed batch it is not (one prefill step).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from specfill.core.ops import Cancelled, WalkRun

from .decode_graph import record

log = logging.getLogger("specfill.backends.torch_cuda")


class WalkCapture(Protocol):
    """How a batch becomes replayable: CUDA graphs on a GPU; tests pass a recorder."""

    def capture(self, run: Callable[[], list[torch.Tensor]], device: torch.device) -> tuple[Callable[[], None], list]:
        """Record `run` (already run once eagerly on the same arrays); return (replay, the recorded
        outputs: the tensors each replay rewrites)."""
        ...


class CudaWalkCapture:
    """torch.cuda.CUDAGraph (decode_graph.record), in a memory pool of the graph's own."""

    def capture(self, run: Callable[[], list[torch.Tensor]], device: torch.device) -> tuple[Callable[[], None], list]:
        graph, outputs = record(run, device)
        return graph.replay, outputs


@dataclass
class WalkGraphStats:
    """Per ops object: batches captured and replayed, seconds spent capturing (the eager first run not
    included: it is the layer's result), and why graphs were turned off (None: they were not)."""

    captured: int = 0
    replayed: int = 0
    capture_seconds: float = 0.0
    refused: str | None = None


def _signature(inputs: list[torch.Tensor]) -> tuple:
    return tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)


def _packed(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """output, scores and the batch's memory sets as one stacked tensor (one clone after a replay)."""
    return outputs[:2] + ([torch.stack(outputs[2:])] if len(outputs) > 2 else [])


def _unpacked(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return outputs[:2] + (list(outputs[2].unbind(0)) if len(outputs) > 2 else [])


class WalkGraphs:
    """One prompt's core/ops.WalkReplay on a CUDA device: one graph per key, replayed (the module doc).
    The graphs of one batch (key[0]; key[1] tells its layers apart: window, soft-cap, sinks) live until
    the next batch's first key."""

    def __init__(self, capture: WalkCapture, stats: WalkGraphStats):
        self.capture = capture
        self.stats = stats
        self.batch: Any = None
        self.entries: dict[Any, tuple[list[torch.Tensor], Callable[[], None], list[torch.Tensor], Any]] = {}

    def __call__(self, key: Any, run: WalkRun[torch.Tensor], inputs: list[torch.Tensor]) -> tuple[list, Any]:
        if key is None or self.stats.refused is not None:
            return run(inputs)
        if key[0] != self.batch:
            self.batch, self.entries = key[0], {}  # the earlier batch's graphs and static inputs are freed
        key = (key, _signature(inputs))
        if key in self.entries:
            statics, replay, outputs, facts = self.entries[key]
            for static, x in zip(statics, inputs):
                static.copy_(x)
            replay()
            self.stats.replayed += 1
            return _unpacked([o.clone() for o in outputs]), facts
        statics = [x.clone() for x in inputs]
        result, facts = run(statics)  # the layer's result, on the arrays the graph will read
        began = time.perf_counter()
        try:
            replay, outputs = self.capture.capture(lambda: _packed(run(statics)[0]), inputs[0].device)
            replay()
            expected = _packed(result)
            if len(outputs) != len(expected) or not all(torch.equal(a, b) for a, b in zip(outputs, expected)):
                raise RuntimeError("the replayed batch differs from the eager one")
        except Cancelled:
            raise
        except Exception as e:  # every later batch as it comes: slower, never wrong
            self.stats.refused = f"{type(e).__name__}: {e}"[:300]
            log.warning("H2O's walk runs without CUDA graphs: %s", self.stats.refused)
            self.entries = {}
            return result, facts
        self.entries[key] = (statics, replay, outputs, facts)
        self.stats.captured += 1
        self.stats.capture_seconds += time.perf_counter() - began
        return result, facts
