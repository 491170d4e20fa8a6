"""First-use kernel self-check: a custom kernel proves itself against its ops twin before it is trusted.

A backend's dispatcher, about to run a custom kernel (Triton, Metal) that it chose on its own
(kernels "auto"), first asks `KERNEL_SELF_CHECK.passes(...)`. Once per process and per (backend,
kernel, dtype, shape class) that runs the kernel and its twin on a small fixed case and compares
every output with the conformance tolerance of the dtype (core/tolerances.py). A compile or
launch error, or a mismatch beyond the tolerance, gives one SpecfillWarning line naming the kernel
and the reason, and the twin is used from then on for that key. Forced kernels ("on") are never
checked: they run, and fail loudly, as asked.

The kernel setting: an explicit `use_kernel` (True / False) wins; None reads SPECFILL_KERNELS
(auto | on | off, unset = auto), the same three words as `--kernels`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from specfill.core.errors import ConfigError, SpecfillWarning

KERNELS_ENV = "SPECFILL_KERNELS"
KERNEL_MODES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}

# (output name, kernel output, twin output), both as NumPy arrays of the same shape
Comparison = tuple[str, np.ndarray, np.ndarray]


def kernels_setting(use_kernel: bool | None = None) -> bool | None:
    """True (force the kernels), False (force the twins) or None (auto: the dispatcher decides).

    An explicit True / False wins; None falls back to SPECFILL_KERNELS (auto when unset);
    another word there is one ConfigError line.
    """
    if use_kernel is not None:
        return bool(use_kernel)
    word = os.environ.get(KERNELS_ENV, "").strip().lower() or "auto"
    if word not in KERNEL_MODES:
        raise ConfigError(f"{KERNELS_ENV}={os.environ[KERNELS_ENV]!r} is not one of auto, on, off")
    return KERNEL_MODES[word]


@contextlib.contextmanager
def kernels_env(word: str | None) -> Iterator[None]:
    """SPECFILL_KERNELS set to `word` (auto / on / off) for the duration; None changes nothing.

    How a command's `--kernels` becomes the setting every dispatcher reads, and is undone after."""
    if word is None:
        yield
        return
    if word not in KERNEL_MODES:
        raise ConfigError(f"kernels must be one of auto, on, off, not {word!r}")
    before = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = word
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = before


def kernels_word(use_kernel: bool | None) -> str:
    """auto / on / off for a setting (the CLI's and SPECFILL_KERNELS' words)."""
    return {None: "auto", True: "on", False: "off"}[use_kernel]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one self-check: reason is None when the kernel matched its twin."""

    backend: str
    kernel: str
    dtype: str
    shape_class: str
    reason: str | None

    @property
    def passed(self) -> bool:
        return self.reason is None


def _compare(comparisons: Iterable[Comparison], dtype: str) -> str | None:
    """None when every output is within the dtype's conformance tolerance, else why not."""
    from .tolerances import TOLERANCES, max_violation

    tol = TOLERANCES[dtype]
    for name, got, want in comparisons:
        error, ok = max_violation(got, want, tol)
        if not ok:
            shape = "" if np.shape(got) == np.shape(want) else f" (shape {np.shape(got)} vs {np.shape(want)})"
            return (
                f"{name} differs from the twin by {error:.3g}{shape}, beyond the {dtype} tolerance "
                f"(atol {tol.atol:g}, rtol {tol.rtol:g})"
            )
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


class KernelSelfCheck:
    """The process-wide verdicts: one self-check per (backend, kernel, dtype, shape class)."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, str, str, str], Verdict] = {}
        self._lock = threading.Lock()

    def passes(
        self,
        backend: str,
        kernel: str,
        dtype: str,
        shape_class: str,
        twin: str,
        run: Callable[[], Iterable[Comparison]],
    ) -> bool:
        """True to use the kernel. `run` launches the kernel and its twin on the small fixed case
        and returns their outputs; any exception it raises counts as a compile / launch error.
        `twin` names what is used instead in the warning ("the torch twin", "the MLX-ops twin")."""
        key = (backend, kernel, dtype, shape_class)
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is None:
                try:
                    reason = _compare(list(run()), dtype)
                except Exception as err:  # noqa: BLE001 - any failure of the kernel is the verdict
                    reason = f"compile or launch error: {_first_line(err)}"
                verdict = self._verdicts[key] = Verdict(backend, kernel, dtype, shape_class, reason)
                if reason is not None:
                    warnings.warn(
                        f"{backend} kernel '{kernel}' ({dtype}, {shape_class}) failed its first-use "
                        f"self-check ({reason}); using {twin} from now on",
                        SpecfillWarning,
                        stacklevel=3,
                    )
        return verdict.passed

    def verdicts(self) -> list[Verdict]:
        """Every self-check run so far in this process, in order."""
        with self._lock:
            return list(self._verdicts.values())

    def reset(self) -> None:
        """Forget every verdict (tests; a process that swapped its kernels)."""
        with self._lock:
            self._verdicts.clear()


KERNEL_SELF_CHECK = KernelSelfCheck()


_TERM_FALLBACKS: set[tuple[str, str]] = set()
_TERM_FALLBACKS_LOCK = threading.Lock()
_VALUE_DIM_FALLBACKS: set[tuple[str, str, str]] = set()  # the latent-attention fallbacks said so far


def note_term_fallback(backend: str, kernel: str, twin: str) -> None:
    """Say once per process and (backend, kernel) that a layer's attention terms (soft-cap, sinks:
    core/stages.AttentionTerms) run `twin` instead of the kernel, which does not take them."""
    with _TERM_FALLBACKS_LOCK:
        if (backend, kernel) in _TERM_FALLBACKS:
            return
        _TERM_FALLBACKS.add((backend, kernel))
    warnings.warn(
        f"{backend} kernel '{kernel}' takes no attention sinks or logit soft-cap; layers with them "
        f"run {twin} (exact, slower)",
        SpecfillWarning,
        stacklevel=3,
    )


def note_value_dim_fallback(backend: str, kernel: str, twin: str) -> None:
    """Say once per process and (backend, kernel) that a layer whose values have another head dim
    than its keys (latent attention) runs `twin` instead of the kernel, which takes one head dim."""
    with _TERM_FALLBACKS_LOCK:
        if (backend, kernel, "value_dim") in _VALUE_DIM_FALLBACKS:
            return
        _VALUE_DIM_FALLBACKS.add((backend, kernel, "value_dim"))
    warnings.warn(
        f"{backend} kernel '{kernel}' takes keys and values of one head dim; layers whose values are "
        f"narrower (latent attention) run {twin} (exact, slower)",
        SpecfillWarning,
        stacklevel=3,
    )


def term_fallbacks() -> list[tuple[str, str]]:
    """(backend, kernel) pairs that fell back to their twin for attention terms so far."""
    with _TERM_FALLBACKS_LOCK:
        return sorted(_TERM_FALLBACKS)
