"""Stopping a generation inside a prefill step: a cancellation check the caller installs.

A prefill step of a long prompt takes seconds on a CPU (a 512-token step of a 1.5B model, ~13 s
here), so a check between steps is not enough for a server whose client left. The server installs
a check around a request (`cancellation`); the models call `checkpoint()` before every transformer
layer (the speculator's layers too) and H2O before every chunk of its walk, and a check that
answers True stops the generation there with `Cancelled`.

A context variable and not an argument: the model's interface stays `model(ids, cache=...)` and
the methods do not carry a callable through every call. With no check installed (the library,
the CLI) `checkpoint()` is one context-variable read, and `installed()` tells a lazy backend
(MLX) that it must evaluate layer by layer for a check between layers to mean anything.

After a Cancelled the prefill's cache may have some layers one step ahead of the others: a
reused cache is cut back on every layer (`ModelOps.truncate`) before it is extended again.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator


class Cancelled(Exception):
    """The installed check answered True: the generation stopped where the check ran (between
    layers, H2O chunks or prefill steps). Not a SpecfillError: nothing is wrong with the request."""


_CHECK: ContextVar[Callable[[], bool] | None] = ContextVar("specfill_cancel_check", default=None)


@contextmanager
def cancellation(is_cancelled: Callable[[], bool]) -> Iterator[None]:
    """Install `is_cancelled` (cheap, thread-safe: e.g. threading.Event.is_set) for the code run
    inside the block on this thread (generators iterated there included)."""
    token = _CHECK.set(is_cancelled)
    try:
        yield
    finally:
        _CHECK.reset(token)


def installed() -> bool:
    """Whether a cancellation check is installed (MLX then evaluates a prefill step per layer)."""
    return _CHECK.get() is not None


def checkpoint() -> None:
    """Raise Cancelled when the installed check answers True (nothing installed: return)."""
    check = _CHECK.get()
    if check is not None and check():
        raise Cancelled
