"""`specfill serve` under mlx.launch: rank 0 serves HTTP, every other rank follows it.

The model is sharded over the ranks (backends/mlx/distributed.py), so every model step needs every
rank. Rank 0 runs the server as usual with a `LeaderEngine`: before each generation (a Plan) and
each idle step of the prompt cache it broadcasts what it is about to do (`Channel`: a pickled
message summed over the group, the others adding zeros, as mlx-lm's server does); the other ranks
run `follow`, which receives each message and does the same with an `Engine` of their own (the
same prompt cache, the same loaded speculator / draft model, the events thrown away) until rank 0
says stop. Loaded models inside a Plan travel as references to each rank's own copy.

Cancellation (a client gone, a server shutdown) must stop every rank at the same point: a rank
that stopped alone would leave the others inside a collective. Here it is agreed between prefill
steps and between generated tokens (`AgreedCancel`: rank 0's flag summed over the group), not
inside a step between layers as one process does (Engine.run's `cancellation` check is not
installed).
"""

from __future__ import annotations

import io
import pickle
import sys
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, overload

import numpy as np

from specfill.core import SpecfillError
from specfill.core.backend import ProcessGroup

from .engine import Engine
from .plan import Plan
from .prompt_cache import PromptCache

if TYPE_CHECKING:
    from specfill.api import Session

RUN, IDLE, STOP = "run", "idle", "stop"


class _Pickler(pickle.Pickler):
    """Loaded models (the speculator, the draft model) as their index in `models`; the Plan's
    cancellation event as nothing (each rank makes its own)."""

    def __init__(self, file: io.BytesIO, models: list[Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.models = models

    def persistent_id(self, obj: Any) -> Any:
        for index, model in enumerate(self.models):
            if obj is model:
                return ("model", index)
        if isinstance(obj, threading.Event):
            return ("event", 0)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, models: list[Any]):
        super().__init__(file)
        self.models = models

    def persistent_load(self, pid: Any) -> Any:
        kind, index = pid
        return self.models[index] if kind == "model" else threading.Event()


class Channel:
    """Rank 0 -> every rank: one message at a time, summed over the group (ProcessGroup.all_sum).
    models: the loaded objects a message may refer to, the same list in the same order on every rank."""

    def __init__(self, model: Any, models: list[Any]):
        if model.distributed is None:
            raise ValueError("a Channel needs a model sharded over a group of processes")
        self.shared: ProcessGroup = model.distributed
        self.models = models

    def send(self, message: Any) -> None:
        buffer = io.BytesIO()
        _Pickler(buffer, self.models).dump(message)
        data = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
        self.shared.all_sum(np.array(data.size, dtype=np.int32))
        self.shared.all_sum(data)

    def receive(self) -> Any:
        size = int(self.shared.all_sum(np.array(0, dtype=np.int32)))
        data = self.shared.all_sum(np.zeros(size, dtype=np.uint8))
        return _Unpickler(io.BytesIO(data.tobytes()), self.models).load()

    def agree(self, flag: bool) -> bool:
        """Whether rank 0's flag is set (the others pass False)."""
        return bool(self.shared.all_sum(np.array(int(flag), dtype=np.int32)))


class AgreedCancel:
    """A Plan's `cancelled` as every rank sees it: is_set() sums rank 0's own event over the group
    (every rank calls it at the same points: after each prefill step, before each token) and stays
    set once set."""

    def __init__(self, channel: Channel, own: threading.Event | None):
        self.channel = channel
        self.own = own  # rank 0's event; None on the others
        self.agreed = False

    def is_set(self) -> bool:
        if not self.agreed:
            self.agreed = self.channel.agree(self.own is not None and self.own.is_set())
        return self.agreed

    def set(self) -> None:
        if self.own is not None:
            self.own.set()


def run_agreed(engine: Engine, plan: Plan, emit: Callable[[Any], None], cancelled: AgreedCancel) -> None:
    """Engine.run with cancellation agreed between the ranks (see the module doc): the same prompt
    cache steps, events and statistics, without the per-layer check."""
    Engine.run(engine, replace(plan, cancelled=cancelled), emit, layer_checks=False)  # not a subclass's run


class LeaderEngine(Engine):
    """Rank 0's engine: says what it does before doing it (Channel), then does it like every rank."""

    def __init__(self, session: Session, cache: PromptCache | None, channel: Channel):
        super().__init__(session, cache)
        self.channel = channel

    def health(self) -> dict[str, Any]:
        return {**super().health(), "distributed": self.model.distributed.describe()}

    def run(self, plan: Plan, emit: Callable[[Any], None]) -> None:
        self.channel.send((RUN, plan))
        run_agreed(self, plan, emit, AgreedCancel(self.channel, plan.cancelled))

    def idle_step(self) -> None:
        self.channel.send((IDLE, None))
        super().idle_step()

    def stop_followers(self) -> None:
        self.channel.send((STOP, None))


def follow(engine: Engine, channel: Channel) -> int:
    """The loop of every rank but 0: do what rank 0 says until it says stop. A request that fails
    fails here too (rank 0 reports it to its client); a lost rank 0 ends this one (DistributedError)."""
    while True:
        kind, payload = channel.receive()
        if kind == STOP:
            return 0
        try:
            if kind == IDLE:
                engine.idle_step()
            else:
                run_agreed(engine, payload, lambda event: None, AgreedCancel(channel, None))
        except SpecfillError as err:
            if type(err).__name__ == "DistributedError":
                raise
            print(
                f"specfill: rank {channel.shared.rank}: a request failed as on rank 0: {err}",
                file=sys.stderr,
                flush=True,
            )


@overload
def engine_for(
    session: Session, prompt_cache: str, cache_tokens: int | None, channel: Channel, cache_memory: float | None = None
) -> LeaderEngine: ...


@overload
def engine_for(
    session: Session, prompt_cache: str, cache_tokens: int | None, channel: None, cache_memory: float | None = None
) -> Engine: ...


def engine_for(
    session: Session,
    prompt_cache: str,
    cache_tokens: int | None,
    channel: Channel | None,
    cache_memory: float | None = None,
) -> Engine:
    """A LeaderEngine (channel given, rank 0) or a follower's Engine, with the prompt cache build_app makes."""
    memory = None if cache_memory is None else int(cache_memory * 1e9)
    context = session.model.args.max_position_embeddings
    cache = None if prompt_cache == "off" else PromptCache(cache_tokens, context, memory)
    return Engine(session, cache) if channel is None else LeaderEngine(session, cache, channel)
