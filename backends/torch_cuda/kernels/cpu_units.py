"""Coarse-grained CPU parallelism for the torch twins: independent work units on a few threads.

Every torch op forks and joins its own team of intra-op threads. The twins issue many small ops
(a few hundred microseconds each), and when other processes hold the cores each join waits for
a descheduled worker: ~8 ms per op measured on a shared 2-core machine, which made H2O prefill
5x slower with 2 threads than with 1. Instead a twin splits its work into independent units
that run with single-threaded ops on the calling thread plus a small pool (torch releases the
GIL inside ops) and joins once per call, as a fused kernel's parallel loop does. Every unit runs
single-threaded whatever the thread count, so results do not depend on it.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

import specfill.backends.torch_cuda.placement as placement  # a module reference: simulated_cuda swaps RUNTIME

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_thread = threading.local()  # .single: this pool thread's ops are single-threaded
_caller = threading.local()  # .threads: the caller's thread count while in units_scope


def _pool_with(n_workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < n_workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(n_workers, thread_name_prefix="specfill-twin"), n_workers
        return _pool


def _drain(unit: Callable[[int], None], taken: Iterator[int], n_units: int) -> None:
    """Run units until none is left (next() on itertools.count is atomic under the GIL)."""
    while (index := next(taken)) < n_units:
        unit(index)


def _pool_drain(unit: Callable[[int], None], taken: Iterator[int], n_units: int, inference: bool, grad: bool) -> None:
    if not getattr(_pool_thread, "single", False):  # pool threads keep one intra-op thread for good
        torch.set_num_threads(1)
        _pool_thread.single = True
    # grad and inference mode are per thread: take the caller's (the model runs in inference mode)
    with torch.inference_mode(inference), torch.set_grad_enabled(grad):
        _drain(unit, taken, n_units)


@contextmanager
def units_scope(device: torch.device) -> Iterator[None]:
    """On CPU, torch ops issued on this thread inside run single-threaded, while run_units still
    spreads its units over the thread count in force outside the scope. Nests; elsewhere a no-op.

    For code that interleaves small ops with run_units (the H2O phase-2 walk): each op would
    otherwise fork and join its own thread team.
    """
    if placement.on_cuda(device) or getattr(_caller, "threads", None) is not None:
        yield
        return
    _caller.threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        # also undoes a pool thread's first set_num_threads(1), which lowers torch's default
        torch.set_num_threads(_caller.threads)
        _caller.threads = None


@contextmanager
def full_width(device: torch.device) -> Iterator[None]:
    """Inside a units_scope, torch ops issued here take the caller's whole thread count again: for
    one large fused op (the CPU flash kernel, kernels/cpu_flash.py) that splits its own work, where
    a thread team's fork and join is small beside the op. Elsewhere a no-op."""
    threads = getattr(_caller, "threads", None)
    if placement.on_cuda(device) or threads is None or threads == torch.get_num_threads():
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(1)


def run_units(unit: Callable[[int], None], n_units: int, device: torch.device) -> None:
    """unit(0) .. unit(n_units - 1); units must write disjoint outputs.

    On CPU they run with single-threaded ops, spread over up to torch.get_num_threads() threads
    (the caller's included; the count outside any units_scope); on other devices in order, on
    the caller's thread, as they are.
    """
    if placement.on_cuda(device):
        for index in range(n_units):
            unit(index)
        return
    with units_scope(device):
        threads = min(_caller.threads, n_units)
        taken = itertools.count()
        helpers = []
        if threads > 1:
            pool = _pool_with(threads - 1)
            modes = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
            helpers = [pool.submit(_pool_drain, unit, taken, n_units, *modes) for _ in range(threads - 1)]
        try:
            _drain(unit, taken, n_units)
        finally:
            wait(helpers)
        for helper in helpers:
            helper.result()  # re-raises a unit's error
