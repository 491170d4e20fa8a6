"""The ops protocol: what a backend implements so that every method is written once.

core/methods/ (H2O, SpecPrefill) and core/driver.py (generation) call only these, generic over the
backend's array type A. A backend is its kernels (behind these stage names), its model, its KV
cache (a `KVCache`, keeping its own books), its loading (core/backend.py) and one `ops` module
implementing `ModelOps` on its arrays; the NumPy reference implements the stage part (`H2OOps`,
`ScoringOps`) and a NumPy `KVCache` (core/reference/kv_cache.py). Shapes as in core/stages.py.

Cancellation inside a step (the end of this module): a prefill step of a long prompt takes seconds
on a CPU (a 512-token step of a 1.5B model, 13-33 s here), so a check between steps is not enough
for a server whose client left. The server installs a check around a request (`cancellation`); a
backend's model calls `checkpoint()` before every transformer layer (the speculator's too) and the
H2O walk before every chunk, and a check that answers True stops the generation there with
`Cancelled`. A context variable, not an argument: the model keeps `model(ids, cache=...)` and the
methods carry no callable. With no check installed (the library, the CLI) `checkpoint()` is one
context-variable read; `installed()` tells a lazy backend (MLX) to evaluate layer by layer only
then. A stopped step can leave the first layers' caches a step ahead: a reused cache is cut back on
every layer (`KVCache.truncate`) before it is extended again.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Generic, Iterator, Protocol, Sequence, TypeVar

import numpy as np

from .errors import ConfigError
from .stages import A, AttentionTerms, H2OStageOps, ScoringStageOps


class H2OOps(H2OStageOps[A], Protocol[A]):
    """The H2O stages over a backend's arrays (the Triton / Metal kernels or their twins:
    core/stages.H2OStageOps) and what else the walk needs of them.

    The walk in core/h2o_walk.py calls only these, so one backend is one implementation.
    """

    def causal_attention(self, q: A, k: A, v: A, scale: float) -> A:
        """Plain causal attention [Hq, N, D] of q [Hq, N, D] over k/v [Hkv, N, D]."""

    def concat(self, arrays: Sequence[A], axis: int) -> A:
        """Concatenate along `axis`."""

    def zero_scores(self, n_kv_heads: int, n_tokens: int, like: A) -> A:
        """[Hkv, N] zeros in the statistics dtype of `like` (N = 0: a carry before any chunk; H2O
        disabled: nothing is scored)."""

    def cast_like(self, x: A, like: A) -> A:
        """x in like's dtype (the layer output keeps q's dtype)."""

    def stage_scope(self, like: A) -> AbstractContextManager[Any]:
        """Entered around one logical batch's stages (the torch CPU work units; else a no-op)."""


WalkRun = Callable[[list[A]], tuple[list[A], Any]]  # arrays in -> (arrays out, host facts), no host read


class WalkReplay(Protocol[A]):
    """How one prompt's H2O batches run (core/methods/h2o.py): `replay(key, run, inputs)` is `run(inputs)`.
    Every layer's batch of one key runs the same operators on inputs of the same shapes, so a backend
    may record `run` once per key and replay it for the next layers' inputs (torch on a GPU: one CUDA
    graph a batch, backends/torch_cuda/walk_graph.py). key: (the batch, what else tells layers apart), a new
    batch's first key ends the earlier batch's recordings; None: run it as it is."""

    def __call__(self, key: Any, run: WalkRun[A], inputs: list[A]) -> tuple[list[A], Any]: ...


def run_directly(key: Any, run: WalkRun[A], inputs: list[A]) -> tuple[list[A], Any]:
    """The WalkReplay that runs every batch as it comes (the reference, MLX, torch off a GPU)."""
    return run(inputs)


def _method_ops_stage(name: str) -> Callable[..., Any]:
    """KernelStages' stage `name`: the backend's method_ops function of that name (plain-library code)."""

    def stage(self: KernelStages[Any], *args: Any, **kwargs: Any) -> Any:
        return getattr(self.method_ops, name)(*args, **kwargs)

    stage.__name__ = stage.__qualname__ = name
    return stage


def _kernel_stage(name: str, chosen: bool = False) -> Callable[..., Any]:
    """KernelStages' stage `name`: the function of that name in the backend's kernels/ package. chosen:
    it runs the kernel or its twin as `use_kernels` says; such a function takes use_kernel among the
    stage's arguments, so these go in by the names core/stages.py declares for them."""
    declared = getattr(H2OStageOps, name, None) or getattr(ScoringStageOps, name)
    names = tuple(inspect.signature(declared).parameters)[1:]  # after self

    def stage(self: KernelStages[Any], *args: Any, **kwargs: Any) -> Any:
        run = getattr(self.stage_kernels(), name)
        if not chosen:
            return run(*args, **kwargs)
        return run(**dict(zip(names, args)), **kwargs, use_kernel=self.use_kernels)

    stage.__name__ = stage.__qualname__ = name
    stage.__doc__ = declared.__doc__
    return stage


def staged_layer_scores(
    ops: Any,
    queries: A,
    keys: A,
    scale: float,
    window: int | None = None,
    terms: AttentionTerms[A] | None = None,
    query_start: int | None = None,
    kernel: int = 1,
    how: str = "max",
) -> A:
    """ScoringOps.layer_scores as its three stages, one after the other: `ops`' attention_scores,
    smooth_scores, then reduce_axis over the heads (KernelStages' and the NumPy reference's)."""
    probs = ops.attention_scores(queries, keys, scale, window, terms, query_start)
    pooled = ops.smooth_scores(probs, kernel)
    del probs  # freed before the reduction's output is made
    return ops.reduce_axis(pooled, how, axis=2)


class KernelStages(Generic[A]):
    """The stages a backend's kernels/ package dispatches, written once for every backend's ops:
    each stage (declared in core/stages.py) is the same-named function of the kernels/ package,
    run as the kernel or its twin as `use_kernels` says (None: the kernel where the device has one;
    True / False force one), or of the backend's `method_ops` module. A backend's ops class sets
    `use_kernels`, `stage_kernels`, its `method_ops` module, its three step attentions (plain_step,
    windowed_step, terms_step) and `slot_positions`."""

    method_ops: Any  # the backend's method_ops module: its plain-library memory-set and scoring ops
    plain_step: Callable[..., A]  # (q, k, v, scale)
    windowed_step: Callable[..., A]  # (q, k, v, scale, window, query_slots, key_slots)
    terms_step: Callable[..., A]  # (q, k, v, scale, terms, query_slots, key_slots, window)
    slot_positions: Callable[[A], Any]  # the cache slot of every key of k (a prompt's prefill: positions)
    use_kernels: bool | None

    intra_attention = _kernel_stage("intra_attention", chosen=True)
    inter_attention = _kernel_stage("inter_attention", chosen=True)
    attention_scores = _kernel_stage("attention_scores", chosen=True)
    add_sinks = _kernel_stage("add_sinks")
    reduce_colsum_to_kv_heads = _kernel_stage("reduce_colsum_to_kv_heads")
    merge_states = _kernel_stage("merge_states")
    accumulate_scores = _method_ops_stage("accumulate_scores")
    build_memory_set = _method_ops_stage("build_memory_set")
    gather_memory = _method_ops_stage("gather_memory")
    smooth_scores = _method_ops_stage("smooth_scores")
    reduce_axis = _method_ops_stage("reduce_axis")
    spread = _method_ops_stage("spread")

    @staticmethod
    def stage_kernels() -> Any:
        """The backend's kernels/ package (imported by the first stage that runs)."""
        raise NotImplementedError

    layer_scores = staged_layer_scores  # a backend that fuses the three stages overrides it

    def walk_replay(self) -> WalkReplay[A]:
        """One prompt's WalkReplay (ModelOps.walk_replay): every batch run as it comes."""
        return run_directly

    # a prompt step's causal attention (ModelOps.causal_step), dispatched once for every backend:
    # the backend gives the three step attentions (plain_step, windowed_step, terms_step) and
    # the slot positions of its cache
    def causal_step(
        self, q: A, k: A, v: A, scale: float, window: int | None = None, terms: AttentionTerms[A] | None = None
    ) -> A:
        if terms is not None and (terms.sinks is not None or terms.softcap is not None):
            slots = self.slot_positions(k)  # a prompt's prefill: slots are positions
            return self.terms_step(q, k, v, scale, terms, slots[k.shape[2] - q.shape[2] :], slots, window)
        if window is None:
            return self.plain_step(q, k, v, scale)
        slots = self.slot_positions(k)
        return self.windowed_step(q, k, v, scale, window, slots[k.shape[2] - q.shape[2] :], slots)


class ScoringOps(ScoringStageOps[A], Protocol[A]):
    """The speculative-prefill scoring stages over a backend's arrays (core/stages.ScoringStageOps)
    and the reductions the methods compose them with."""

    def reduce_axis(self, x: A, how: str, axis: int) -> A:
        """ "max" or "mean" over `axis` (probabilities stay float32 or wider)."""

    def layer_scores(
        self,
        queries: A,
        keys: A,
        scale: float,
        window: int | None = None,
        terms: AttentionTerms[A] | None = None,
        query_start: int | None = None,
        kernel: int = 1,
        how: str = "max",
    ) -> A:
        """attention_scores (its arguments), smooth_scores(kernel), then reduce_axis(how) over the
        heads: [n_q, n_l, P]. The numbers of those three stages; a backend may run them fused (the
        torch CPU ops: tile by tile, no [n_q, n_l, Hq, P] probabilities made)."""

    def concat(self, arrays: Sequence[A], axis: int) -> A:
        """Concatenate along `axis`."""

    def spread(self, x: A, columns: np.ndarray, width: int) -> A:
        """x [..., S] placed at `columns` (S distinct indices, NumPy) of zeros [..., width]."""


class PrefillAttention(Protocol[A]):
    """How a prefill step attends (H2O, the speculator's query capture); causal otherwise.

    Called per layer with its index, the step's post-RoPE queries [1, Hq, T, D] and every key and
    value cached so far [1, Hkv, S, D] (the step's own in the last T slots); returns [1, Hq, T, D]
    in q's dtype."""

    def __call__(self, layer: int, q: A, k: A, v: A) -> A: ...

    def arrays(self) -> list[A]:
        """State carried between steps (a lazy backend evaluates it with the cache)."""

    def queries_from(self, layer: int, steps: int, end: int) -> int:
        """The first of a step's `steps` queries (the step ends at cache slot `end`) this attention
        must see in `layer` whatever the model reads of that layer's output (`last_rows`): 0 all of
        them (an H2O layer: every query adds to the heavy-hitter scores), `steps` none."""


def last_rows(steps: int, logits_from: int | None, attend: PrefillAttention[Any] | None, layer: int, end: int) -> int:
    """The first of a step's `steps` rows the model's last layer (`layer`, the step ending at cache
    slot `end`) computes past its keys and values: the rows whose logits are asked for (logits_from;
    None: none) and those `attend` must see. Nothing else reads the last layer's output, so its
    queries, attention, output projection and MLP run for those rows only (llama.cpp's output rows):
    the same values for them, 1 / n_layers of a prefill step saved. Every row's keys and values are
    still cached."""
    rows = steps if logits_from is None else logits_from
    if rows and attend is not None:
        rows = min(rows, attend.queries_from(layer, steps, end))
    return max(0, min(rows, steps))


class LayerCache(Protocol[A]):
    """One layer's KV cache (mlx-lm's interface): slots fill in order from `offset`."""

    offset: int

    def update_and_fetch(self, keys: A, values: A) -> tuple[A, A]:
        """Store post-RoPE keys/values [1, Hkv, T, D] in the next T slots; return every filled
        slot's keys and values [1, Hkv, offset + T, D]."""

    def trim(self, n: int) -> int:
        """Forget the last n filled slots (rejected draft tokens); returns how many were dropped."""


class KVCache(Protocol[A]):
    """A model's KV cache, every layer's: one LayerCache per layer (`layers`) in the backend's own
    container, made by ModelOps.new_cache and filled by ModelOps.forward; the rest of its books are
    its own. Every layer fills the same slots, except a prefill stopped between layers (see above).

    A hybrid model's cache (recurrent layers beside attention: core/hybrid.py's books, a backend's hybrid_cache.py) is
    one too: its `layers` and `keys` are its attention layers'; `trim` / `truncate` restore a kept
    recurrent state (ValueError where it kept none), and two optional methods say so:
    `mark()` keeps the state at the current slot count (the driver calls it after each prefill)
    and `exact_prefix(slots)` names the longest prefix it can stand at (the prompt cache reads it);
    a third, `save_point(slots)`, names the prefix its `save` writes (its latest prompt-end mark:
    serve/prompt_store.py, core/io/hybrid_state.py)."""

    layers: Sequence[LayerCache[A]]

    @property
    def filled(self) -> int:
        """Filled slots (every layer fills the same ones)."""

    @property
    def capacity(self) -> int:
        """Slots it can hold without growing."""

    def grown(self, capacity: int) -> KVCache[A]:
        """A cache holding these filled slots with room for `capacity` (may be this one)."""

    def trim(self, n: int, n_layers: int | None = None) -> None:
        """Drop the last n filled slots of every layer (of the first n_layers only: a "self:K"
        draft's writes into the main cache)."""

    def truncate(self, slots: int) -> None:
        """Cut every layer back to its first `slots` filled slots (a prefill stopped between
        layers, `Cancelled`, leaves the first layers a step ahead of the others)."""

    def keys(self, end: int) -> A:
        """Every layer's keys of slots [0, end): [n_layers, Hkv, end, D]."""

    def layer_keys(self, layer: int, end: int) -> A:
        """One layer's keys of slots [0, end): [1, Hkv, end, D], no copy (SpecPrefill's scoring)."""

    @property
    def nbytes(self) -> int:
        """Bytes its buffers occupy now: every reserved slot, filled or not (the prompt cache of
        `specfill serve` bounds its memory by it)."""

    def copy(self, slots: int, capacity: int | None = None) -> KVCache[A]:
        """A new cache holding the first `slots` filled slots of every layer, with room for
        `capacity` (at least `slots`), sharing no memory with this one: extending either leaves
        the other intact (the prompt cache hands a request a shared prefix of a conversation
        it keeps). Costs one copy of those slots' keys and values."""

    def save(self, path: str, slots: int, metadata: dict[str, str]) -> None:
        """Write the first `slots` slots to a safetensors file at `path` (ending in .safetensors):
        tensors "keys" and "values" [n_layers, Hkv, slots, D] (MLX: "keys.i" / "values.i" per layer
        where layers differ in shape, Gemma 4's) (a backend's also "positions" [slots]
        int64, its slots' RoPE positions) and the str -> str `metadata` in its header."""

    def load(self, path: str) -> int:
        """Fill this empty cache (room for the file's slots) from a file `save` wrote; returns the
        slots read; ValueError when the file does not fit this cache."""


LayerT = TypeVar("LayerT", bound=LayerCache[Any])


class LayerBooks(Generic[LayerT]):
    """A KVCache's `filled`, `trim` and `truncate` read off its layers' own offsets: the books every
    backend's cache and the reference's keep the same way (a subclass sets `layers`, its layers' type LayerT)."""

    layers: list[LayerT]

    @property
    def filled(self) -> int:
        return self.layers[0].offset

    def trim(self, n: int, n_layers: int | None = None) -> None:
        for layer in self.layers[:n_layers]:
            layer.trim(n)

    def truncate(self, slots: int) -> None:
        for layer in self.layers:
            layer.trim(layer.offset - slots)


class ModelOps(H2OOps[A], ScoringOps[A], Protocol[A]):
    """Everything the methods and the generation driver need from a backend, on its arrays.

    `model` below is the backend's model object (or its first-K-layers view), `cache` its KVCache
    (`new_cache`), which keeps its own books. Positions are an int (the first of
    consecutive ones) or an int64 NumPy array [T] (speculative prefill's original positions).
    """

    name: str  # "cuda" or "mlx": the backend's name in CLI and reports
    lazy: bool  # the backend evaluates lazily: decode queues step n+1 before handing out token n

    def activation_dtype(self, model: Any) -> Any:
        """The dtype `model` computes its activations in."""

    def device_scope(self) -> AbstractContextManager[Any]:
        """Entered around a whole prefill and decode (MLX's stream, torch's inference mode)."""

    def walk_replay(self) -> WalkReplay[A]:
        """A new prompt's WalkReplay (the H2O walk's batches, run or replayed)."""

    def verify_scope(self) -> AbstractContextManager[Any]:
        """Entered around a speculative-decoding verify step (k + 1 rows): a backend may pick the
        product order that suits a few rows there (torch CPU: Linear in backends/torch_cuda/model.py). Only
        there, so that prefill logits stay bitwise the same for every prefill step size."""

    def tokens(self, ids: np.ndarray) -> A:
        """Token ids [T] (int64 NumPy, checked) as the backend's integer array on its device."""

    def forward(
        self,
        model: Any,
        ids: A,
        positions: int | np.ndarray,
        cache: KVCache[A],
        attend: PrefillAttention[A] | None,
        logits_from: int | None,
    ) -> A | None:
        """One step: ids [T] appended to `cache` at RoPE `positions`; float32 logits
        [T - logits_from, vocab] for the step's tokens from `logits_from` on (None: no LM head)."""

    def capture_step(
        self, model: Any, ids: A, position: int, cache: KVCache[A], layers: Sequence[int]
    ) -> tuple[A, A] | None:
        """The speculator's look-ahead step, where the backend has one faster than `forward` with the
        QueryCapture (None: it has not): ids [T] at positions position.. over every cached key (each layer's
        window, no terms) -> (float32 logits [T, vocab], post-RoPE queries [len(layers), T, Hq, D])."""

    def layer_states(
        self, model: Any, ids: A, positions: int | np.ndarray, cache: KVCache[A], attend: PrefillAttention[A] | None
    ) -> A:
        """forward's step through `model`'s blocks only (a first_layers view: its first K): their
        output [T, hidden] for every row, before the final norm. ConfigError for a model that
        cannot be split (a nested speculator, SpecPrefillConfig.deep_keep)."""

    def forward_from(
        self,
        model: Any,
        first_layer: int,
        states: A,
        positions: int | np.ndarray,
        cache: KVCache[A],
        attend: PrefillAttention[A] | None,
        logits_from: int | None,
    ) -> A | None:
        """forward from block `first_layer` on: states [T, hidden] is that block's input
        (layer_states of the first first_layer blocks), stored in those blocks' cache slots."""

    @property
    def device_name(self) -> str:
        """Where it runs, for reports: "cuda:0 (NVIDIA H100 ...)", "cpu", "gpu (Metal)"."""

    @property
    def compute_threads(self) -> int:
        """CPU threads the backend's ops run on (part of the machine a calibration belongs to)."""

    def schedule(self, arrays: list[Any]) -> None:
        """Start evaluating these arrays without waiting (MLX's async_eval); eager: nothing."""

    def settle(self, arrays: list[Any]) -> None:
        """Evaluate pending work on these arrays / caches (MLX), nothing for eager backends."""

    def wall_time(self) -> float:
        """perf_counter once the device's queued work has finished."""

    def decode_setup_seconds(self) -> float:
        """Seconds spent so far, over the process, preparing decode steps (compiling them,
        capturing graphs): reported apart from decode speed, never counted in it; 0 where none."""

    def new_cache(self, model: Any, capacity: int) -> KVCache[A]:
        """A KV cache for every layer of `model`, room for `capacity` slots."""

    def first_layers(self, model: Any, n_layers: int) -> Any:
        """A view of `model`'s first n blocks with its embedding, final norm and LM head."""

    def splits(self, model: Any) -> bool:
        """Whether layer_states / forward_from run `model` in two parts (specfill's own families;
        elsewhere they raise cannot_split)."""

    def causal_step(
        self, q: A, k: A, v: A, scale: float, window: int | None = None, terms: AttentionTerms[A] | None = None
    ) -> A:
        """Causal attention of a step: q [1, Hq, T, D] over every cached k/v [1, Hkv, S, D], slots
        being positions (a prompt's prefill from slot 0); window w: query p sees keys > p - w;
        terms: the layer's soft-cap and sinks (core/stages.AttentionTerms)."""

    def last_queries(self, q: A, n: int) -> A:
        """A copy of the step's last n queries of every head: q [1, Hq, T, D] -> [n, Hq, D]."""

    def stack(self, arrays: Sequence[A]) -> A:
        """Stack along a new leading axis."""

    def argmax(self, logits: A) -> A:
        """The most likely token of float32 logits [vocab] as an int array [1], the lowest id among
        tied maxima (plain greedy decoding; every other choice is core/sampling.py's)."""

    def item(self, x: A) -> int:
        """A one-element array's value on the host."""

    def to_numpy(self, x: A) -> np.ndarray:
        """Host copy (floating types as float32 or float64)."""

    def peak_memory_gb(self) -> float:
        """Peak device memory (or process memory on CPU) since reset_peak_memory (or ever), in GB."""

    def reset_peak_memory(self) -> bool:
        """Count peak_memory_gb again from what is held now; False where it cannot be reset."""


class Cancelled(Exception):
    """The installed check answered True: the generation stopped where the check ran (between
    layers, H2O chunks or prefill steps). Not a SpecfillError: nothing is wrong with the request."""


_CANCEL_CHECK: ContextVar[Callable[[], bool] | None] = ContextVar("specfill_cancel_check", default=None)


@contextmanager
def cancellation(is_cancelled: Callable[[], bool] | None) -> Iterator[None]:
    """Install `is_cancelled` (cheap, thread-safe: e.g. threading.Event.is_set) for the code run
    inside the block on this thread (generators iterated there included); None: no check there."""
    token = _CANCEL_CHECK.set(is_cancelled)
    try:
        yield
    finally:
        _CANCEL_CHECK.reset(token)


def installed() -> bool:
    """Whether a cancellation check is installed (MLX then evaluates a prefill step per layer)."""
    return _CANCEL_CHECK.get() is not None


def cannot_split() -> ConfigError:
    """What a backend raises when a nested speculator (SpecPrefillConfig.deep_keep) would run a model
    its layer_states / forward_from cannot split in two (adapted families, whose forward is theirs)."""
    return ConfigError(
        "deep_keep: a nested speculator needs one of specfill's own model families, not an adapted one",
        "deep_keep",
        config="SpecPrefillConfig",
    )


def checkpoint() -> None:
    """Raise Cancelled when the installed check answers True (nothing installed: return)."""
    check = _CANCEL_CHECK.get()
    if check is not None and check():
        raise Cancelled
