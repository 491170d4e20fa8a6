"""The backend contract: what the API, the CLI and the server ask of a backend, and what its load returns.

A backend is a package under backends/ whose loader module implements these functions:
  load(path, dtype=None, device=None, prefill_step_size=...) -> (LoadedModel, Tokenizer)
  resolve_device(device) -> its device object     resolve_dtype(dtype, device=None) -> its dtype
  cpu_fallback(device) -> the notice that `device` runs on the CPU for want of its GPU, or None
  facts() -> its platform as `specfill doctor` reports it    synchronize(device): wait for the device
  kernel_matrix() -> its kernels checked on the real device (MLX: the Metal matrix), or None
  launched_group() -> the process group a launcher started this process in (a `distributed` backend's)
and whose package __init__ holds its `Backend` object (found by name through the registry in
backends/__init__.py: "mlx", "cuda", or "torch" for "cuda"). The object imports nothing heavy: its
array library and model code come with the loader module, imported by the first call that needs
it. So naming a backend costs nothing, and a missing library is one line (`available()`, or
BackendUnavailableError from the calls), never a traceback. A loaded model carries its ops
(core/ops.py's ModelOps, `model.ops`) and makes its KV caches through them (core/ops.py's KVCache).

What core and the server may ask of a backend's objects beyond core/ops.py's protocols is declared
here and in core/runtime.py, so that they ask by type, never by probing attributes (hasattr /
getattr: tests/test_layout.py refuses those outside backends/):
  RecurrentCache (core/runtime.py, beside KVState): a hybrid model's KV cache.
  ProcessGroup: a model sharded over a group of processes (LoadedModel.distributed; the mlx backend's
    backends/mlx/distributed.py `Distributed`): what the API and the server need of it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Generic, Protocol, TypeVar

import numpy as np

from .errors import BackendUnavailableError, ConfigError
from .models import ModelArgs
from .ops import ModelOps
from .stages import A

DEFAULT_PREFILL_STEP_SIZE = 2048  # tokens per prefill step (mlx-lm's default too)
T = TypeVar("T")


class ProcessGroup(Protocol):
    """A model sharded over a group of processes, as seen from one of them (module doc)."""

    @property
    def rank(self) -> int:
        """This process's rank, 0 .. size - 1."""

    @property
    def size(self) -> int:
        """The number of processes (> 1)."""

    def describe(self) -> str:
        """For the statistics: "2 ranks, tensor"."""

    def check_request(self, request: Any) -> Any:
        """The request (core/request.py's GenerationRequest) as every rank must run it, or ConfigError."""

    def collect(self, run: Callable[[], T]) -> T:
        """run() with a rank that is gone raised as one line (the backend's DistributedError)."""

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        """`values` summed over the group, elementwise (every rank passes the same shape and dtype);
        a rank that is gone raises as in `collect`."""


class LoadedModel(Generic[A]):
    """A Llama/Mistral/Qwen2/Qwen3/Gemma 3 model on one backend: the backend's model object and its
    ops (core/driver.py's CausalLM, what `load` returns, adds generation; a method module takes a
    loaded model through this class without importing the driver that calls it).

    prefill_step_size: tokens per full-attention prefill step (bounds activation memory).
    """

    def __init__(self, model: Any, ops: ModelOps[A], *, prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE):
        if prefill_step_size < 1:
            raise ConfigError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.ops = ops
        self.args: ModelArgs = model.args
        self.prefill_step_size = prefill_step_size
        # sharded over a group of processes (ProcessGroup; the mlx backend's Distributed); None: one process
        self.distributed: ProcessGroup | None = None

    @property
    def backend(self) -> str:
        return self.ops.name

    @property
    def device_name(self) -> str:
        """Where it runs, for reports: "cuda:0 (NVIDIA H100 ...)", "cpu", "gpu (Metal)"."""
        return self.ops.device_name

    @property
    def dtype(self) -> Any:
        """The activation dtype (the backend's own dtype object)."""
        return self.ops.activation_dtype(self.model)


@dataclass(frozen=True)
class Backend:
    """One backend: its name, whether it can run here, its device and dtype rules, and load()."""

    name: str  # the name it is reported by ("mlx", "cuda")
    extra: str  # the pip extra that installs its libraries: pip install 'specfill[extra]'
    loader_module: str  # the module implementing the functions above, imported on first use
    distributed: bool = False  # it shards a model over a group of processes (load's group=, launched_group)
    # a copy of its KV cache (KVCache.copy) may be written to disk from a thread other than the one that
    # made it (the server's background prompt-cache writes); MLX: no (its lazy arrays are evaluated on
    # their own thread's stream, and its safetensors writer evaluates: ml-explore/mlx#3529)
    threaded_writes: bool = True

    def available(self) -> str | None:
        """None where this backend can load models (its libraries import), else why not, in one line."""
        try:
            importlib.import_module(self.loader_module)
        except ModuleNotFoundError as err:
            return (
                f"backend {self.name!r} needs {err.name!r}, which is not installed "
                f"(pip install 'specfill[{self.extra}]')"
            )
        return None

    def loader(self) -> ModuleType:
        """The loader module; BackendUnavailableError (available()'s line) where it cannot import."""
        reason = self.available()
        if reason is not None:
            raise BackendUnavailableError(reason)
        return importlib.import_module(self.loader_module)

    def load(
        self,
        path: str | Path | tuple[Any, Any],
        dtype: Any = None,
        device: Any = None,
        prefill_step_size: int | None = None,
        *,
        group: Any = None,
        pipeline: bool = False,
    ) -> tuple[LoadedModel, Any]:
        """(CausalLM, Tokenizer) from a GGUF file, a model directory or another library's (model,
        tokenizer) pair, on `device` in `dtype` (None: this backend's defaults, see resolve_device and
        resolve_dtype). Missing, corrupt or unsupported checkpoints raise ModelLoadError.
        group (MLX only): an mx.distributed group sharding the model (pipeline: by layers, else by
        heads); see backends/mlx/distributed.py."""
        options: dict[str, Any] = {} if prefill_step_size is None else {"prefill_step_size": prefill_step_size}
        if group is not None:
            if not self.distributed:
                raise ConfigError(f"a distributed group (group=) is supported on the mlx backend only, not {self.name}")
            options.update(group=group, pipeline=pipeline)
        return self.loader().load(path, dtype=dtype, device=device, **options)

    def resolve_device(self, device: Any) -> Any:
        """The backend's device object for a name ("cpu", "cuda:0", "gpu") or None (its default);
        ConfigError for an unknown name, BackendUnavailableError for a device this machine lacks."""
        return self.loader().resolve_device(device)

    def resolve_dtype(self, dtype: Any, device: Any = None) -> Any:
        """The backend's dtype for a name ("bf16", "float32", ...) or None on `device` (a name or
        None: resolved first); ConfigError for a dtype the backend does not compute in."""
        return self.loader().resolve_dtype(dtype, self.resolve_device(device))

    def cpu_fallback(self, device: str | None) -> str | None:
        """The notice that loading on `device` (None: the default) runs on the CPU because the GPU
        this backend is for is missing, or None when it does not fall back."""
        return self.loader().cpu_fallback(device)

    def launched_group(self) -> Any:
        """The process group this process was started in by the backend's launcher (mlx.launch, mpirun)
        when it has more than one rank, for load's `group`; None where there is none, the backend does
        not shard models (not `distributed`) or its libraries are missing."""
        if not self.distributed or self.available() is not None:
            return None
        return self.loader().launched_group()

    def facts(self) -> dict[str, Any]:
        """Its platform as `specfill doctor` reports it (GPU, BLAS, threads, whether its kernels can run
        here); {"installed": False} where its libraries are missing."""
        if self.available() is not None:
            return {"installed": False}
        return self.loader().facts()

    def synchronize(self, device: Any) -> None:
        """Wait until the work queued on `device` (a name or its device object) is done: a timing's end."""
        self.loader().synchronize(device)

    def kernel_matrix(self) -> dict[str, Any] | None:
        """Every kernel of the backend against its twin on the real device ({"cells", "failures",
        "device"}: MLX's Metal matrix, backends/mlx/kernels/matrix.py), or None where it has none."""
        return self.loader().kernel_matrix()
