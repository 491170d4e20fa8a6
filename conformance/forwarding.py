"""The conformance adapters' stages, made from the stage protocol rather than spelled per stage.

The stages are declared once (core/stages.py: `H2OStageOps`, `ScoringStageOps`, and the boundary's
`H2OStages`, `SpecPrefillStages`). An adapter takes NumPy in and gives NumPy out; `forward_stages`
gives its class one method per stage those protocols declare, with the stage's own signature:
each argument goes in through `StageBoundary.stage_in` by its parameter name (`ARGUMENTS`: compute
dtype for q/k/v, the statistics dtype for m, l, scores and probabilities, integers for memory
sets), the call goes where the adapter's `route` sends it, and the result comes back through
`stage_out` by its type. A stage added to a protocol is forwarded with no line here; an argument
of a new kind needs its parameter name in `ARGUMENTS` (tests/test_conformance_forwarding.py).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from specfill.core.stages import (
    AttentionState,
    AttentionTerms,
    H2OLayerResult,
    InterResult,
    IntraResult,
    KeyWindow,
    MemorySet,
    Selection,
    active_terms,
    stage_names,
)


@dataclass(frozen=True)
class Convert:
    """NumPy <-> a backend's arrays: native (compute dtype), stats (statistics dtype), index
    (memory-set positions) and numpy (back; float16 / bfloat16 widened to float32)."""

    native: Callable[[np.ndarray], Any]
    stats: Callable[[np.ndarray], Any]
    index: Callable[[np.ndarray], Any]
    numpy: Callable[[Any], np.ndarray]


# a stage's parameter name -> how its NumPy value enters the backend (a name not here passes as it is:
# sizes, scales, chunk positions, configs, a window size)
ARGUMENTS = {
    **dict.fromkeys(("q", "k", "v", "k_mem", "v_mem", "queries", "keys"), "native"),
    **dict.fromkeys(("colsum", "scores", "kv_colsum", "probs", "sinks", "importance"), "stats"),
    **dict.fromkeys(("memory", "previous"), "memory"),
    **dict.fromkeys(("state", "a", "b"), "state"),
    "terms": "terms",
    "window": "window",
}


class StageBoundary:
    """NumPy in, the backend's arrays to its stages, NumPy out (`cv`: the backend's Convert)."""

    cv: Convert

    def stage_in(self, name: str, value: Any) -> Any:
        """A stage's argument `name` on the backend's arrays (None stays None)."""
        kind = ARGUMENTS.get(name)
        if value is None or kind is None:
            return value
        if kind == "native":
            return self.cv.native(value)
        if kind == "stats":
            return self.cv.stats(np.asarray(value))
        if kind == "memory":
            return MemorySet(self.cv.index(np.asarray(value.indices)), value.chunk_index)
        if kind == "state":
            return AttentionState(self.cv.stats(value.m), self.cv.stats(value.l), self.cv.native(value.o))
        if kind == "terms":  # a layer without terms is passed none (its sinks in the statistics dtype)
            terms = active_terms(value)
            sinks = None if terms is None or terms.sinks is None else self.cv.stats(np.asarray(terms.sinks))
            return None if terms is None else AttentionTerms(sinks, terms.softcap)
        if isinstance(value, KeyWindow) and value.key_positions is not None:  # phase 2's gathered positions
            return replace(value, key_positions=self.cv.index(np.asarray(value.key_positions)))
        return value

    def stage_out(self, value: Any) -> Any:
        """A stage's result back in NumPy, by its type (a Selection, made on the host, as it is)."""
        if isinstance(value, (IntraResult, InterResult)):
            return type(value)(self.stage_out(value.state), self.cv.numpy(value.colsum))
        if isinstance(value, AttentionState):
            return AttentionState(self.cv.numpy(value.m), self.cv.numpy(value.l), self.cv.numpy(value.o))
        if isinstance(value, MemorySet):
            return MemorySet(self.cv.numpy(value.indices).astype(np.int64), value.chunk_index)
        if isinstance(value, H2OLayerResult):
            memory_sets = [self.stage_out(m) for m in value.memory_sets]
            return H2OLayerResult(self.cv.numpy(value.output), self.cv.numpy(value.scores), memory_sets)
        if isinstance(value, tuple):
            return tuple(self.cv.numpy(x) for x in value)
        return value if isinstance(value, Selection) else self.cv.numpy(value)


# (the adapter, a stage's name) -> the callable that computes the stage on the backend's arrays
Route = Callable[[Any, str], Callable[..., Any]]


def forwarder(protocol: type, name: str, route: Route) -> Callable[..., Any]:
    """The adapter method for stage `name` of `protocol`: its signature and doc, arguments in
    through stage_in, the routed call, the result out through stage_out."""
    declared = getattr(protocol, name)
    signature = inspect.signature(declared)

    def stage(self: StageBoundary, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = [self.stage_in(p, v) for p, v in list(bound.arguments.items())[1:]]
        return self.stage_out(route(self, name)(*values))

    stage.__name__ = stage.__qualname__ = name
    stage.__doc__ = declared.__doc__
    stage.__signature__ = signature  # type: ignore[attr-defined]
    return stage


def forward_stages(route: Route, *protocols: type) -> Callable[[type], type]:
    """Class decorator: a forwarding method (`forwarder`) for every stage `protocols` declare that
    the class does not define itself."""

    def decorate(cls: type) -> type:
        for protocol in protocols:
            for name in stage_names(protocol):
                if name not in vars(cls):
                    setattr(cls, name, forwarder(protocol, name, route))
        return cls

    return decorate
