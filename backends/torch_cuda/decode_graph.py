"""Decode steps with static shapes, replayed as CUDA graphs (gpt-fast's pattern, by hand).

A decode step of an 8B model is ~600 small kernels; launched one by one from Python the GPU waits
on the host (~60 ms per token measured on an H200, results/gpu/h200/analysis.md, where the weights'
read alone takes ~3.4 ms). A CUDA graph launches them all at once, but replays fixed addresses and
shapes, so the step is written with static shapes:

- the T tokens' ids, RoPE positions and cache slots live in static input buffers;
- keys and values are written at the slots with `index_copy_` (no Python offset baked in), through
  one op of its own (`write_slots`) that a compiled step keeps in place;
- attention reads a fixed BUCKET of slots (the filled ones rounded up to a multiple of
  `SLOT_BUCKET`, at most the capacity) with a mask: query t sees slot s iff s <= slot_t (and,
  on a sliding layer, its window by position). One graph per (T, bucket): a decode of 32 tokens
  at 8K context captures one or two;
- grouped heads are folded into query rows ([1, Hq, T, D] -> [1, Hkv, G*T, D]), so no KV head
  is ever copied;
- the attention call is chosen once per device and shape (attention_choice.decode_kernel: on
  CUDA the faster of one masked SDPA call and the Triton split-key kernel, probed at the first
  eager step; elsewhere, and in a compiled step, SDPA).

`static_step` is that computation, eager; `DecodeGraphs` runs it eagerly the first time a
(T, bucket) is seen (that call's result is the real one), captures it, and replays the capture
from then on. A graph belongs to its cache, and every prompt has a new one, so every prompt's first
step is captured again; where the process has run and captured that kind of step before (the same
model, T and kept layers, the keys laid out alike, the split-key kernel's variant compiled), the eager
run is skipped: captured, then replayed
(the H200's 8B: a decode's setup was an eager step of ~25 ms and a capture of about as much, 50-140 ms
a request in 2026-12-04's rows). SpecPrefill's look-ahead takes the same step (`run_keeping`): it also returns the
scored layers' post-RoPE queries, and where a nested speculator's deeper layers hold a subset of the
prompt in their own slots, each run of layers filled alike writes and reads its own slots and bucket.
`compiled=True` first compiles the step with torch.compile (inductor; one graph, no breaks: the
model skips its per-layer cancellation check and the CPU-only product order while compiling), which
fuses the element-wise kernels; its roundings then differ from the eager step's (fused float32
intermediates), so it is opt-in and its tokens are compared, not assumed.
The graphs are stored on the cache they write (ModelKVCache.graphs): a graph
records the cache's addresses, so it lives and dies with that cache. The eager path
(TorchOps.decode_graphs False) runs the same `static_step` without capture, so graphs on and off
give bitwise the same tokens (the same kernels, replayed).

Capture time (the eager first run and the capture itself) is counted in `setup_seconds`, which the
statistics report apart and never as decode speed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol, TypeAlias, Union

import torch

from specfill.core.errors import PromptTooLongError
from specfill.core.ops import Cancelled

from .attention_choice import grouped_decode
from .cache import ModelKVCache
from .rope import apply_rope, rotate_and_store

StepOutput: TypeAlias = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]  # logits, or (logits, kept queries)
SLOT_BUCKET = 1024  # slots per attention bucket: at most 1023 masked slots read per step (~12% at 8K)
log = logging.getLogger("specfill.backends.torch_cuda")


def write_slots(cache: torch.Tensor, dim: int, slots: torch.Tensor, values: torch.Tensor) -> None:
    """cache's entries at `slots` [T] along `dim` <- values, in place (index_copy_).

    An op of its own so that a compiled step (torch.compile) writes the cache in place: traced, an
    `index_copy_` or `index_put_` into a layer of the stacked cache is functionalised into a new
    buffer of the whole cache, written back after the step (inductor's code for a tiny Llama on the
    CPU: two cache-sized buffers per layer and a copy of the whole cache, every step); a custom op
    that declares its mutation is kept as one in-place call."""
    cache.index_copy_(dim, slots, values)


if hasattr(torch.library, "custom_op"):  # torch >= 2.4; before, a plain function (compiled steps copy)
    write_slots = torch.library.custom_op("specfill::write_slots", mutates_args=("cache",))(write_slots)


class _Slots:
    """A run of layers filled alike: their next T slots (a static input [T]) and the bucket they read."""

    def __init__(self, tokens: int, bucket: int, device: torch.device, index: int = 0):
        self.slots = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.bucket = bucket
        self.index = index  # the run's place in the step (0: the first layers')


class _StaticLayer:
    """A layer cache view for the static step: writes at its run's slots tensor, returns its bucket."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, run: _Slots):
        self.k, self.v, self.positions, self.run = keys, values, positions, run

    def update_and_fetch(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        write_slots(self.k, 2, self.run.slots, k)
        write_slots(self.v, 2, self.run.slots, v)
        bucket = self.run.bucket
        return self.k[:, :, :bucket], self.v[:, :, :bucket]

    def store_rotated(
        self, qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cache.LayerKVCache.store_rotated at the step's slots: on a GPU one launch (never in a compiled
        step, whose writes stay write_slots)."""
        q = rotate_and_store(qk, v, cos, sin, n_heads, self.k, self.v, self.run.slots)
        if q is None:
            qk = apply_rope(qk, cos, sin)
            return (qk[:, :n_heads], *self.update_and_fetch(qk[:, n_heads:], v))
        bucket = self.run.bucket
        return q, self.k[:, :, :bucket], self.v[:, :, :bucket]

    def slot_positions(self, step_positions: torch.Tensor) -> torch.Tensor:
        return self.positions[: self.run.bucket]


class _StaticCache:
    def __init__(self, cache: ModelKVCache, step: "_StepInputs"):
        self.layers = [
            _StaticLayer(k, v, cache.positions, step.run_of(i)) for i, (k, v) in enumerate(zip(cache.k, cache.v))
        ]


class _StepInputs(_Slots):
    """The static inputs of one (T, buckets) step: ids, positions and the first layers' slots [T] on
    the device (its own `slots` and `bucket`), the attention call (attention_choice.decode_kernel's
    name: auto, sdpa or split-triton), the layers whose queries the step also returns (SpecPrefill's
    look-ahead; none for decoding) and `deeper`: (first layer, bucket) of each later run of layers
    filled to other slots (a nested speculator's deeper layers hold a subset of the prompt; none
    for decoding)."""

    def __init__(
        self,
        tokens: int,
        bucket: int,
        device: torch.device,
        attention: str = "auto",
        kept: tuple[int, ...] = (),
        deeper: tuple[tuple[int, int], ...] = (),
    ):
        super().__init__(tokens, bucket, device)
        self.ids = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.attention = attention
        self.kept = kept
        self.runs: list[tuple[int, _Slots]] = [(0, self)]
        self.runs += [(first, _Slots(tokens, b, device, i + 1)) for i, (first, b) in enumerate(deeper)]

    def run_of(self, layer: int) -> _Slots:
        """The run of layers `layer` belongs to."""
        return [run for first, run in self.runs if first <= layer][-1]


class _MaskedAttention:
    """The step's attention (a PrefillAttention for Transformer.forward): q [1, Hq, T, D] over the
    bucket's keys/values [1, Hkv, bucket, D]; query t sees slot s iff s <= slots[t] (its layer's run's
    slots), and on a sliding layer also positions[t] - key_position[s] < window."""

    def __init__(self, model: Any, cache: ModelKVCache, step: _StepInputs):
        self.windows = [layer.self_attn.window for layer in model.layers]
        self.scale = model.args.attention_scale
        self.cache, self.step = cache, step
        self._visible: dict[int, torch.Tensor] = {}  # by run
        self._biases: dict[tuple[int, int | None, int, torch.dtype], torch.Tensor] = {}
        self.queries: dict[int, torch.Tensor] = {}  # layer -> q [1, Hq, T, D], the step's kept layers

    def visible(self, run: _Slots, window: int | None) -> torch.Tensor:
        """[T, bucket] bool: which of the run's slots each query sees."""
        if run.index not in self._visible:
            slots = torch.arange(run.bucket, device=run.slots.device)
            self._visible[run.index] = slots[None, :] <= run.slots[:, None]
        if window is None:
            return self._visible[run.index]
        distance = self.step.positions[:, None] - self.cache.positions[None, : run.bucket]
        return self._visible[run.index] & (distance < window)

    def bias(self, run: _Slots, window: int | None, group: int, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask [1, 1, G*T, bucket] (0 where seen, -inf elsewhere; row g * T + t takes
        query t's row), built once per step, run and window: SDPA would turn a boolean mask into this
        again in every layer. The same values SDPA builds, so the same results."""
        key = (run.index, window, group, dtype)
        if key not in self._biases:
            rows = self.visible(run, window)
            rows = rows.repeat(group, 1) if group > 1 else rows
            hidden = torch.zeros(rows.shape, dtype=dtype, device=rows.device).masked_fill_(~rows, float("-inf"))
            self._biases[key] = hidden[None, None]
        return self._biases[key]

    def __call__(self, layer: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if layer in self.step.kept:
            self.queries[layer] = q
        bias = self.bias(self.step.run_of(layer), self.windows[layer], q.shape[1] // keys.shape[1], q.dtype)
        return grouped_decode(self.step.attention, q, keys, values, bias[0, 0], self.scale)

    def arrays(self) -> list[Any]:
        return []

    def queries_from(self, layer: int, steps: int, end: int) -> int:
        return 0  # a decode or verify step reads every row's logits


def static_step(model: Any, cache: ModelKVCache, step: _StepInputs) -> StepOutput:
    """The step on the static inputs: writes the T tokens' keys/values at step.slots and their
    positions, returns float32 logits [T, vocab], and with step.kept also the post-RoPE queries
    [len(kept), T, Hq, D] of those layers (in kept's order). No host synchronisation, no
    data-dependent shape."""
    write_slots(cache.positions, 0, step.slots, step.positions)
    attend = _MaskedAttention(model, cache, step)
    logits = model(step.ids[None], step.positions, _StaticCache(cache, step), 0, attend)
    if not step.kept:
        return logits[0]
    return logits[0], torch.stack([attend.queries[layer][0].transpose(0, 1) for layer in step.kept])


class Capture(Protocol):
    """How a step becomes replayable: CUDA graphs on a GPU; tests pass a recorder."""

    def capture(
        self, run: Callable[[], StepOutput], device: torch.device, cache: ModelKVCache
    ) -> Callable[[], StepOutput]:
        """Record `run` (already run once eagerly) over `cache`'s buffers; return a replay that
        reruns it and returns its output (the same static tensors every time)."""
        ...


def record(run: Callable[[], Any], device: torch.device, pool: Any = None) -> tuple[Any, Any]:
    """(a torch.cuda.CUDAGraph of `run`, run's output): captured on a side stream (torch's requirement),
    in `pool` (None: a pool of the graph's own); `run` ran eagerly before, so every kernel is warm.

    Captured with CUDAGraph.capture_begin / capture_end, not the torch.cuda.graph context, whose entry
    synchronises the device and empties the allocator's cache "to free memory for the graph": captures
    come in the middle of a request (an H2O walk's first batch of a prompt, a decode's or a look-ahead's
    first step), where that drained the queued work and handed every cached block back to the driver, for
    the rest of the prompt to cudaMalloc again (the H200's composition at 32K: 72 cudaMalloc and 70 cudaFree,
    both of which wait for the device, 16 ms of host time in a 470 ms TTFT; 2026-12-04 run2). vLLM's
    captures skip that emptying too. The side stream waits for the queued work, so nothing is recorded
    over data still being written. A capture that fails is made once more as the context made it, after a
    synchronisation and with the cache emptied: a graph whose memory does not fit beside the cached blocks
    (a capture cannot hand them back: out of memory, or the allocator's cudaFree refused inside the capture)
    is then captured as before; a step that cannot be captured at all fails again, with the retry's error."""
    try:
        return _record(run, device, pool)
    except Cancelled:  # a cancelled request (core/ops.checkpoint, seen by a walk batch's run): not a failure
        raise
    except Exception:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return _record(run, device, pool)


def _record(run: Callable[[], Any], device: torch.device, pool: Any) -> tuple[Any, Any]:
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            output = run()
        except BaseException:  # the capture is ended, and the error raised is run's, not the ending's
            try:
                graph.capture_end()
            except Exception:
                pass
            raise
        graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, output


class CudaGraphCapture:
    """torch.cuda.CUDAGraph, every graph of one cache in one memory pool of that cache's own.

    A pool is never shared across caches: once every graph of a pool is freed the allocator
    releases it, and capturing into that pool id again trips its internal assert (seen on the
    H200 with torch 2.11: every later allocation failed; vLLM #53682 is the same failure)."""

    def capture(
        self, run: Callable[[], StepOutput], device: torch.device, cache: ModelKVCache
    ) -> Callable[[], StepOutput]:
        fresh = cache.graph_pool is None
        if fresh:
            cache.graph_pool = torch.cuda.graph_pool_handle()
        try:
            graph, output = record(run, device, cache.graph_pool)
        except BaseException:
            if fresh:  # its only graph failed, so the pool is released: the cache's next capture takes a new one
                cache.graph_pool = None
            raise

        def replay() -> StepOutput:
            graph.replay()
            return output

        return replay


class DecodeGraphs:
    """Runs decode steps (T <= ops.MAX_GRAPH_TOKENS tokens at the cache's next slots) through static
    steps, captured once per (model, T, bucket) on the cache and replayed after. `capture` None:
    eager static steps (the same kernels, no graph)."""

    def __init__(self, capture: Capture | None, compiled: bool = False, attention: str = "auto"):
        self.capture = capture
        # a compiled step traces no probe: SDPA there (inductor fuses around it)
        self.attention = "sdpa" if compiled and attention == "auto" else attention
        self.setup_seconds = 0.0  # eager first runs, compilations and captures, summed over the process
        self.refused: set[tuple[int, int, tuple[int, ...]]] = set()  # (model, T, kept layers) whose capture failed
        # kinds run eagerly and captured once, by their keys' layouts: a new cache's (a new prompt's) first step
        # of one of them is captured without its eager run (capture_first: off once such a capture failed)
        self.warm: set[tuple[tuple[int, int, tuple[int, ...]], tuple]] = set()  # (kind, _variants)
        self.capture_first = True
        self.step = static_step
        self.compiled = compiled
        if compiled:  # inductor fuses the element-wise work (norms, RoPE, masks): fewer, larger kernels
            import torch._dynamo

            for limit in ("recompile_limit", "cache_size_limit"):  # one compilation per (T, bucket)
                if hasattr(torch._dynamo.config, limit):
                    setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
            self.step = torch.compile(static_step, dynamic=False, fullgraph=True)

    @property
    def failed(self) -> bool:
        """A capture failed (logged once); those steps run eagerly."""
        return bool(self.refused)

    @staticmethod
    def bucket(cache: ModelKVCache, start: int, tokens: int) -> int:
        """The slots a step writing [start, start + tokens) reads: rounded up to SLOT_BUCKET, at most the capacity."""
        return min(cache.capacity, -(-(start + tokens) // SLOT_BUCKET) * SLOT_BUCKET)

    def run(self, model: Any, ids: torch.Tensor, positions: torch.Tensor, cache: ModelKVCache) -> torch.Tensor:
        """ids [T] at RoPE positions [T] into the cache's next T slots; float32 logits [T, vocab]."""
        return self._run(model, ids, positions, cache, ())

    def run_keeping(
        self, model: Any, ids: torch.Tensor, positions: torch.Tensor, cache: ModelKVCache, kept: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """run's step that also returns the post-RoPE queries [len(kept), T, Hq, D] of the layers
        `kept` (SpecPrefill's look-ahead, ModelOps.capture_step): (logits, queries)."""
        if not kept:
            raise ValueError("run_keeping needs at least one layer whose queries it keeps")
        return self._run(model, ids, positions, cache, tuple(kept))

    def _run(
        self, model: Any, ids: torch.Tensor, positions: torch.Tensor, cache: ModelKVCache, kept: tuple[int, ...]
    ) -> Any:
        tokens = ids.shape[0]
        # (first layer, next slot) of each run of layers filled alike: one run but in a nested speculator
        offsets = [layer.offset for layer in cache.layers]
        runs = [(i, start) for i, start in enumerate(offsets) if i == 0 or start != offsets[i - 1]]
        for _, start in runs:
            if start + tokens > cache.capacity:
                raise PromptTooLongError(
                    f"KV cache holds {cache.capacity} tokens, writing slots {start}..{start + tokens - 1}"
                )
        buckets = tuple((first, self.bucket(cache, start, tokens)) for first, start in runs)
        key = (id(model), tokens, buckets, kept)
        entry = cache.graphs.get(key)
        if entry is None:
            if len(runs) > 1 and any(layer.self_attn.window is not None for layer in model.layers):
                raise ValueError("a static step of layers filled to different slots takes no sliding window")
            entry, out = self._first(model, ids, positions, cache, kept, runs, buckets)
            cache.graphs[key] = entry
            if out is not None:  # the eager first run: the step's real result
                self._advance(cache, tokens)
                return out
        else:
            self._fill(entry[0], ids, positions, runs)
        step, replay = entry
        out = self.step(model, cache, step) if replay is None else replay()
        self._advance(cache, tokens)
        # the replay's output tensors are rewritten by the next replay
        return out.clone() if isinstance(out, torch.Tensor) else tuple(x.clone() for x in out)

    def _first(
        self,
        model: Any,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelKVCache,
        kept: tuple[int, ...],
        runs: list[tuple[int, int]],
        buckets: tuple[tuple[int, int], ...],
    ) -> tuple[tuple[_StepInputs, Any], Any]:
        """A (T, buckets) step new to this cache: its static inputs filled and its graph, as (step, replay);
        and the eager first run's result, or None where the step was captured first (its replay is the
        step). The time spent here but in a replay is setup_seconds."""
        began, tokens = time.perf_counter(), ids.shape[0]
        step = _StepInputs(tokens, buckets[0][1], ids.device, self.attention, kept, buckets[1:])
        ends = [first for first, _ in runs[1:]] + [len(cache.layers)]
        for (first, start), (_, bucket), end in zip(runs, buckets, ends):
            # the bucket's unfilled slots are read (masked): a masked weight is 0, but 0 * NaN is
            # NaN, so uninitialised memory there must become finite once
            cache.k[first:end, :, :, start + tokens : bucket].zero_()
            cache.v[first:end, :, :, start + tokens : bucket].zero_()
        self._fill(step, ids, positions, runs)
        kind = (id(model), tokens, kept)  # a capture that failed for a step is not tried again for its next buckets
        capturing = self.capture is not None and kind not in self.refused
        warm = (kind, self._variants(model, cache, buckets, tokens)) if capturing else None
        out, replay = None, None
        if warm in self.warm and self.capture_first and not self.compiled:
            replay = self._capture(model, cache, step, kind, first=True)
        if replay is None:
            out = self.step(model, cache, step)
            replay = self._capture(model, cache, step, kind) if capturing else None
            if replay is not None:
                self.warm.add(warm)
        self.setup_seconds += time.perf_counter() - began
        return (step, replay), out

    @staticmethod
    def _variants(model: Any, cache: ModelKVCache, buckets: tuple[tuple[int, int], ...], tokens: int) -> tuple:
        """What a step's first run sets up beyond its kind: per run of layers, the probe of the keys' layout
        (padded: a bucket short of the capacity, or not) and the split-key kernel's compiled variant; and the
        cache's layer and head strides as the Triton kernels writing and reading it specialise them (a
        multiple of 16 elements: with a head size such as 72, the capacity's parity decides)."""
        strides = tuple(c.stride(d) % 16 == 0 for c in (cache.k, cache.v) for d in (0, 2))
        try:
            from .kernels.decode_triton import compiled_variant
        except ImportError:  # no Triton: no split-key kernel to compile
            return strides, tuple(bucket == cache.capacity for _, bucket in buckets)
        rows = model.args.num_attention_heads // model.args.num_key_value_heads * tokens  # folded query rows
        dim = cache.v.shape[-1]
        return strides, tuple(
            (bucket == cache.capacity, compiled_variant(bucket, rows, dim, cache.k.dtype)) for _, bucket in buckets
        )

    def _capture(self, model: Any, cache: ModelKVCache, step: _StepInputs, kind: tuple, first: bool = False) -> Any:
        """The step captured (None where the capture failed), after its eager first run, or with `first`
        before any: a kind this process has run and captured before (another cache, another bucket), whose
        first run set up what it sets up once (the attention kernel's probe for the keys' layout, the
        split-key kernel's compiled variant: _variants; cuBLAS on the capture stream). A failure after
        the eager run leaves the kind eager (slower, never wrong); one with `first` (something compiled or
        probed on first use that _variants does not name) falls back to the eager first run, and no
        later step captures first."""
        try:
            return self.capture.capture(lambda: self.step(model, cache, step), step.ids.device, cache)
        except Cancelled:  # the request was cancelled inside the capture (a layer's check): not the kind's failure
            raise
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            if first:
                log.info("decode steps run eagerly once before their capture: a capture failed (%s)", reason)
                self.capture_first = False
            else:
                if not self.failed:
                    log.warning("decode steps run without CUDA graphs: capture failed (%s)", reason)
                self.refused.add(kind)
            return None

    @staticmethod
    def _fill(step: _StepInputs, ids: torch.Tensor, positions: torch.Tensor, runs: list[tuple[int, int]]) -> None:
        step.ids.copy_(ids)
        step.positions.copy_(positions)
        for (_, start), (_, run) in zip(runs, step.runs):
            torch.arange(start, start + ids.shape[0], out=run.slots)

    @staticmethod
    def _advance(cache: ModelKVCache, tokens: int) -> None:
        for layer in cache.layers:
            layer.offset += tokens
