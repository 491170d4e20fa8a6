"""An mlx-lm model sharded over an `mx.distributed` group by mlx-lm's OWN code, run by specfill.

`load_distributed` (what `specfill.load(..., group=g)` reaches for a group of size > 1) loads the
mlx-lm model lazily, shards it with the model's own `Model.shard(group)` (tensor parallelism: each
rank holds a share of the query and KV heads and of the MLP; `o_proj` and the MLP's down projection
all-sum) or `Model.model.pipeline(group)` (pipeline parallelism, `pipeline=True`: each rank holds a
run of layers; rank size-1 the first, rank 0 the last, the hidden state passes down the ranks and is
all-gathered at the end), then adapts it as `adapt` does: the adapter takes over attention only.

Per rank:
  full prefill and decoding: every rank runs the same steps; every rank gets the same logits
    (tensor: the all-sums; pipeline: mlx-lm's all-gather of the last hidden state) and samples
    the same token (a sampling run without a seed gets one agreed seed, rank 0's).
  H2O: tensor: each rank runs the two-phase prefill of its own KV heads (memory sets per local KV
    head: global head = rank * local heads + local head); pipeline: each rank runs it for its own
    layers (the other layers' memory sets are empty lists there).
  SpecPrefill: the speculator is a separate small model, loaded WITHOUT a group on every rank
    (replicated): every rank scores and selects the same kept positions, and every rank prefills
    those kept tokens at their original positions. "self:K" (the main model's first K layers) is
    refused: under tensor parallelism each rank would score with its own heads only, under
    pipeline parallelism the first K layers live on other ranks.
  Drafting: a draft model loaded without a group (replicated) works on both; "self:K" drafting
    works under tensor parallelism (the first K layers run sharded) and is refused under pipeline
    parallelism. The draft length is fixed (Drafting.adaptive off): a length chosen from each
    rank's own clock would differ between ranks.
  The prompt cache (KVState reuse): each rank keeps its own share of the KV cache; reuse works
    when every rank passes the state of the same earlier generation.
  "auto" without auto_threshold is refused: the crossover is measured per machine.
A rank that dies ends the others at their next collective with DistributedError (one line).
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specfill.core.driver import CausalLM
from specfill.core.errors import ConfigError, ModelLoadError, SpecfillError, quote
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.methods.specprefill import QueryCapture

from .adapted import AdaptedModel, AdaptedOps, _activation_dtype, _args, _check_caches, _config, adapt
from .adapted_loader import _tokenizer_source
from .adapter import AdaptedAttention, StepState, attention_of, describe_layer
from .cache import LayerKVCache, ModelKVCache

KINDS = ("tensor", "pipeline")
# what the ring / MPI / JACCL back-ends say when a peer is gone
LOST_PEER = (
    "connection to a peer was lost",
    "closed by the peer",
    "Too many send/recv errors",
    "[ring]",
    "[mpi]",
    "[jaccl]",
)


class DistributedError(SpecfillError):
    """A rank of the group is gone (it died or was stopped): this rank cannot go on."""

    reported = threading.Event()  # one was raised in this process: a later SIGTERM adds no second line

    def __init__(self, message: str):
        super().__init__(message)
        DistributedError.reported.set()


def stop_on_terminate(rank: int, size: int) -> bool:
    """mlx.launch ends every rank with SIGTERM when one fails: this rank then writes one line,
    `specfill: error: rank R of N: another rank is gone ...`, and exits at once (status 143),
    even while its main thread waits inside a collective (a thread watches signal.set_wakeup_fd,
    which the interpreter writes from its C handler). Unless a DistributedError already said so.
    Installed from the main thread only (False elsewhere, and where SIGTERM has a handler of its own);
    a handler set later (the server's: drain, then stop the other ranks) takes over from it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write)
    except ValueError:
        return False

    def ours(*_: Any) -> None:  # the watcher below acts; the default would kill silently
        return None

    signal.signal(signal.SIGTERM, ours)
    line = (
        f"specfill: error: rank {rank} of {size}: another rank is gone (mlx.launch stopped this one after "
        f"a rank failed); stopping\n"
    ).encode()

    def watch() -> None:
        while True:
            got = os.read(read, 16)
            if signal.SIGTERM in got and signal.getsignal(signal.SIGTERM) is ours:  # else: a server's own
                if not DistributedError.reported.is_set():
                    os.write(2, line)
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="specfill-sigterm", daemon=True).start()
    return True


@dataclass(frozen=True)
class Distributed:
    """How a loaded model is shared: its group, this rank, the kind ("tensor" or "pipeline");
    core/backend.py's ProcessGroup (LoadedModel.distributed)."""

    group: Any
    kind: str

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def describe(self) -> str:
        """For the statistics: "2 ranks, tensor"."""
        return f"{self.size} ranks, {self.kind}"

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        """`values` summed over the group on every rank (core/backend.py's ProcessGroup), on the CPU
        stream, evaluated; a lost peer raises DistributedError."""

        def summed() -> np.ndarray:
            total = mx.distributed.all_sum(mx.array(values), group=self.group, stream=mx.cpu)
            mx.eval(total)
            return np.asarray(total)

        return self.collect(summed)

    def agree_seed(self) -> int:
        """A seed every rank gets the same of: rank 0's fresh random one (the others add 0)."""
        own = int(np.random.default_rng().integers(0, 2**31 - 1)) if self.rank == 0 else 0
        return int(self.all_sum(np.array(own, dtype=np.int32)))

    def check_request(self, request: Any) -> Any:
        """The request as every rank must run it (core/request.py's GenerationRequest): one seed for a
        sampling run without one, a fixed draft length; "auto" without a threshold refused."""
        method = request.method
        if method.name == "auto" and method.auto_threshold is None:
            raise ConfigError(
                "method 'auto' under a distributed group needs auto_threshold (--auto-threshold): "
                "the crossover measured on each rank could differ"
            )
        if request.sampling.temperature > 0 and request.sampling.seed is None:
            request = replace(request, sampling=replace(request.sampling, seed=self.agree_seed()))
        if request.drafting is not None and request.drafting.adaptive:
            request = replace(request, drafting=replace(request.drafting, adaptive=False))
        return request

    def lost_peer(self, err: BaseException) -> BaseException:
        """err as a DistributedError when it says a peer is gone, else err itself."""
        text = str(err)
        if isinstance(err, RuntimeError) and any(mark in text for mark in LOST_PEER):
            line = text.strip().splitlines()[-1] if text.strip() else type(err).__name__
            return DistributedError(f"rank {self.rank} of {self.size}: another rank is gone ({line}); stopping")
        return err

    def collect(self, run: Any) -> Any:
        """run() with a lost peer raised as DistributedError."""
        try:
            return run()
        except RuntimeError as err:
            raised = self.lost_peer(err)
            if raised is err:
                raise
            raise raised from None


def refuse_self_layers(kind: str, what: str = "'self:K'") -> ConfigError:
    why = (
        "each rank would score with its own share of the heads"
        if kind == "tensor"
        else "its first K layers live on other ranks"
    )
    return ConfigError(
        f"{what} (the main model's first layers) is refused under {kind} parallelism: {why}; "
        f"load a small speculator / draft model on every rank (specfill.load without group)"
    )


class PipelineKVCache(ModelKVCache):
    """Every layer's LayerKVCache, of which this rank fills only its own layers [first, end): its
    books (filled, capacity) are its first own layer's."""

    def __init__(self, layers: list[LayerKVCache], first: int):
        super().__init__(layers)
        self.first = first

    @property
    def filled(self) -> int:
        return self.layers[self.first].offset

    @property
    def capacity(self) -> int:
        size = self.layers[self.first].max_size
        return size if size is not None else 1 << 62

    def keys(self, end: int) -> mx.array:
        raise ConfigError("a pipeline rank holds the keys of its own layers only")

    def layer_keys(self, layer: int, end: int) -> mx.array:
        return self.keys(end)  # the same error


class PipelinedAdaptedModel(AdaptedModel):
    """An mlx-lm model after `Model.model.pipeline(group)`: `lm.layers` are this rank's layers
    [start, end) (global indices kept by the adapted layers), mlx-lm's forward receives, runs them,
    sends and all-gathers; this rank's caches are the cache's [start, end)."""

    def __init__(self, lm: nn.Module, args: Any, state: StepState, start: int, end: int):
        self.lm, self.args, self.state, self.n_layers = lm, args, state, None
        self.dtype = _activation_dtype(lm)
        self._backbone = lm.model
        self.start, self.end = start, end

    def first_layers(self, n_layers: int) -> AdaptedModel:
        raise refuse_self_layers("pipeline")

    def _cache_list(self, cache: Sequence[Any] | None) -> list[Any]:
        """This rank's layers' entries [start, end) of `cache` (every layer's)."""
        return [None] * (self.end - self.start) if cache is None else [cache[i] for i in range(self.start, self.end)]


class DistributedOps(AdaptedOps):
    """AdaptedOps for a sharded model: the speculator's query capture on the sharded model itself
    ("self:K") is refused; a pipeline rank's KV cache keeps its books by its own layers."""

    def __init__(self, device: mx.Device, *, quantized: bool, distributed: Distributed, lm: nn.Module):
        super().__init__(device, quantized=quantized)
        self.distributed = distributed
        self.sharded_lm = lm

    def forward(self, model: Any, ids, positions, cache, attend, logits_from) -> mx.array | None:
        if isinstance(attend, QueryCapture) and isinstance(model, AdaptedModel) and model.lm is self.sharded_lm:
            raise refuse_self_layers(self.distributed.kind, "SpecPrefill's speculator 'self:K'")
        return super().forward(model, ids, positions, cache, attend, logits_from)

    def new_cache(self, model: Any, capacity: int) -> ModelKVCache:
        if isinstance(model, PipelinedAdaptedModel):
            return PipelineKVCache([LayerKVCache(capacity) for _ in range(model.args.num_hidden_layers)], model.start)
        return super().new_cache(model, capacity)


def _check_can_shard(lm: nn.Module, architecture: str, kind: str, size: int) -> None:
    """ConfigError naming what mlx-lm's model file lacks for `kind`, or heads that do not split."""
    can_tensor = hasattr(lm, "shard")
    can_pipeline = hasattr(lm, "model") and hasattr(lm.model, "pipeline")
    if kind == "tensor" and not can_tensor:
        other = " (it has pipeline parallelism: pipeline=True, --pipeline)" if can_pipeline else ""
        raise ConfigError(f"{architecture}: mlx-lm has no tensor-parallel code for it (no Model.shard){other}")
    if kind == "pipeline" and not can_pipeline:
        other = " (it has tensor parallelism: leave pipeline off)" if can_tensor else ""
        raise ConfigError(
            f"{architecture}: mlx-lm has no pipeline-parallel code for it (no Model.model.pipeline){other}"
        )
    if kind == "tensor":
        config = _config(lm)  # a wrapped text model's (Qwen3.5's text_config)
        heads, kv = (
            config.get("num_attention_heads"),
            config.get("num_key_value_heads") or config.get("num_attention_heads"),
        )
        if heads and kv and (heads % size or kv % size):
            raise ConfigError(
                f"{architecture}: {heads} query and {kv} KV heads do not split over {size} ranks "
                f"(tensor parallelism needs both divisible by the group size)"
            )
    if kind == "pipeline" and len(lm.layers) < size:
        raise ConfigError(f"{architecture}: {len(lm.layers)} layers cannot split over {size} ranks")


def _check_local_heads(model: AdaptedModel, config: dict[str, Any], size: int, architecture: str) -> None:
    """After shard(): the adapter read every layer's LOCAL head counts (global / size)."""
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    for index in model.args.attention_layers:  # a hybrid's recurrent layers: the library's, unchecked here
        layout = model.args.layers[index]
        if layout.refusal is None and (layout.n_heads * size != heads or layout.n_kv_heads * size != kv):
            raise ModelLoadError(
                f"{architecture} layer {index}: the adapter read {layout.n_heads} query / "
                f"{layout.n_kv_heads} KV heads after shard() over {size} ranks, expected "
                f"{heads // size} / {kv // size}"
            )


def _adapt_pipelined(lm: nn.Module, layouts: tuple, architecture: str) -> PipelinedAdaptedModel:
    """adapt() for a pipelined model: this rank's layers get the layouts read before the split
    (every layer's, so AdaptedArgs still describes the whole model) at their global indices."""
    start, end = lm.model.start_idx, lm.model.end_idx
    local = list(lm.layers)
    for offset, layer in enumerate(local):
        if attention_of(layer) is None:
            layout = layouts[start + offset]
            raise ModelLoadError(
                f"{architecture} layer {start + offset} is {layout.kind}: specfill's pipeline-parallel "
                f"model runs softmax-attention layers only (hybrids run unsharded or tensor-parallel)"
            )
    _check_caches(lm, architecture, layouts[start:end])
    state = StepState()
    for offset, layer in enumerate(local):
        name, module = attention_of(layer)
        layer[name] = AdaptedAttention(module, layouts[start + offset], start + offset, state)
    return PipelinedAdaptedModel(lm, _args(lm, layouts), state, start, end)


def load_distributed(
    source: str | Path | tuple[nn.Module, Any],
    dtype: mx.Dtype | None,
    device: mx.Device,
    prefill_step_size: int,
    *,
    group: Any,
    pipeline: bool = False,
) -> tuple[CausalLM, Any]:
    """(CausalLM, Tokenizer) of an mlx-lm model sharded over `group` (size > 1) by mlx-lm's own
    Model.shard (tensor) or Model.model.pipeline (pipeline=True), as mlx_lm.utils.sharded_load
    does (lazy load, shard, evaluate: each rank materialises its own share only), then adapted.
    A (model, tokenizer) pair must be unsharded; it is sharded here."""
    kind = "pipeline" if pipeline else "tensor"
    if isinstance(source, tuple):
        lm, directory = source[0], _tokenizer_source(source[1])
        if getattr(getattr(lm, "model", None), "pipeline_size", 1) > 1:
            raise ModelLoadError("the mlx-lm model is pipelined already: pass it unsharded with group=")
    else:
        directory = Path(source)
        from mlx_lm.utils import load_model

        try:
            lm, _ = load_model(directory, lazy=True)
        except Exception as err:  # mlx-lm raises ValueError, KeyError, FileNotFoundError, ...
            raise ModelLoadError(
                f"{quote(directory)}: mlx-lm could not load it: {str(err).splitlines()[0][:200]}"
            ) from None
    if not isinstance(lm, nn.Module):
        raise ModelLoadError(f"expected an mlx-lm model (mlx.nn.Module), got {type(lm).__name__}")
    config = _config(lm)  # a wrapped text model's (Qwen3.5's text_config), under the outer model type
    architecture = str(config.get("model_type") or type(lm).__module__.rsplit(".", 1)[-1])
    distributed = Distributed(group, kind)
    _check_can_shard(lm, architecture, kind, distributed.size)
    stop_on_terminate(distributed.rank, distributed.size)
    wanted = dtype if dtype is not None else (mx.float32 if device.type == mx.DeviceType.cpu else None)
    with mx.stream(device):
        if pipeline:
            layouts = tuple(describe_layer(config, index, layer) for index, layer in enumerate(lm.layers))
            recurrent = next((i for i, layout in enumerate(layouts) if layout.recurrent or layout.parallel), None)
            if recurrent is not None:  # refused before any rank is waited for
                raise ModelLoadError(
                    f"{architecture} layer {recurrent} is {layouts[recurrent].kind}: specfill's pipeline-parallel "
                    f"model runs softmax-attention layers only (hybrids run unsharded or tensor-parallel)"
                )
            lm.model.pipeline(group)
        else:
            lm.shard(group)
        if wanted is not None:
            lm.set_dtype(wanted)
        mx.eval(lm.parameters())
        distributed.collect(lambda: mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu)))
        if pipeline:
            model: AdaptedModel = _adapt_pipelined(lm, layouts, architecture)
        else:
            model = adapt(lm)
            _check_local_heads(model, config, distributed.size, architecture)
    quantized = any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in lm.named_modules())
    ops = DistributedOps(device, quantized=quantized, distributed=distributed, lm=lm)
    loaded = CausalLM(model, ops, prefill_step_size=prefill_step_size)
    loaded.distributed = distributed
    return loaded, load_tokenizer(directory)
