"""The stage protocol is declared once (core/stages.py) and every implementation and conformance
adapter covers it: a stage added to the protocol without an implementation fails here."""

import importlib
import inspect
import sys
from typing import Protocol

import numpy as np
import pytest

from specfill.conformance import ReferenceAdapter
from specfill.conformance.forwarding import ARGUMENTS, forward_stages
from specfill.conformance.ops_adapter import OpsAdapter
from specfill.core.ops import H2OOps, KernelStages, ScoringOps
from specfill.core.reference import ReferenceStages
from specfill.core.stages import H2OStageOps, H2OStages, ScoringStageOps, SpecPrefillStages, stage_names

BOUNDARY = stage_names(H2OStages, SpecPrefillStages)


def _implements(cls: type, name: str, protocols: tuple[type, ...]) -> bool:
    """cls has `name` from somewhere other than a protocol's declaration."""
    found = inspect.getattr_static(cls, name, None)
    return callable(found) and all(found is not vars(p).get(name) for p in protocols for p in p.__mro__)


@pytest.mark.parametrize("adapter", [OpsAdapter, ReferenceAdapter])
def test_each_adapter_covers_every_boundary_stage(adapter):
    missing = [n for n in BOUNDARY if not _implements(adapter, n, (H2OStages, SpecPrefillStages))]
    assert not missing, missing
    assert isinstance(ReferenceAdapter(), H2OStages) and isinstance(ReferenceAdapter(), SpecPrefillStages)


def test_each_implementation_covers_every_stage():
    """The NumPy reference implements the ops (H2OOps, ScoringOps) and the boundary; the backends'
    kernel dispatch (KernelStages, both backends' ops) every stage that protocol declares."""
    ops = (H2OOps, ScoringOps, H2OStages, SpecPrefillStages)
    missing = [n for n in stage_names(*ops) if not _implements(ReferenceStages, n, ops)]
    kernel = [n for n in stage_names(H2OStageOps, ScoringStageOps) if not _implements(KernelStages, n, ops)]
    assert not missing and not kernel, (missing, kernel)


def test_every_stage_argument_is_known_to_the_boundary():
    """An array argument the forwarding does not know would reach a backend as NumPy: every stage's
    parameters are in ARGUMENTS or plain values (sizes, scales, configs)."""
    plain = {"chunk_size", "scale", "n_kv_heads", "chunk_index", "chunk_start", "chunk_end", "local", "heavy"}
    plain |= {"with_colsum"}
    plain |= {"query_start", "kernel", "config", "prefix", "head_reduction", "layer_reduction", "lookahead_reduction"}
    protocols = (H2OStages, SpecPrefillStages)
    names = {p for n in BOUNDARY for p in inspect.signature(getattr(protocols[n not in dir(H2OStages)], n)).parameters}
    assert names - {"self"} <= set(ARGUMENTS) | plain, names - set(ARGUMENTS) - plain


def test_a_stage_added_to_the_protocol_is_forwarded():
    """A protocol that grows a stage gives the adapter a method with its signature, converting in and out."""

    class Grown(H2OStageOps, Protocol):
        def scale_scores(self, scores, factor: float):
            """A made-up stage."""

    class Ops:
        def scale_scores(self, scores, factor):
            return scores * factor

    @forward_stages(lambda adapter, name: getattr(adapter.ops, name), Grown)
    class Adapter(OpsAdapter):
        pass

    adapter = ReferenceAdapter("float32")
    grown = Adapter("grown", "float32", Ops(), adapter.cv, None)
    got = grown.scale_scores(np.ones(3), factor=2.0)
    assert got.dtype == np.float32 and got.tolist() == [2.0, 2.0, 2.0]
    assert list(inspect.signature(Adapter.scale_scores).parameters) == ["self", "scores", "factor"]


def _implementations(backend: str) -> dict[str, list]:
    """Each declared stage's implementations in `backend`: the reference function, or a backend's
    dispatcher (kernels/) or method_ops function, with its twin where it has one."""
    if backend == "reference":
        return {n: [getattr(ReferenceStages, n)] for n in stage_names(H2OStageOps, ScoringStageOps)}
    package = pytest.importorskip(f"specfill.backends.{backend}.kernels")
    method_ops = importlib.import_module(f"specfill.backends.{backend}.method_ops")
    found = {}
    for name in stage_names(H2OStageOps, ScoringStageOps):
        stage = getattr(package, name, None) or getattr(method_ops, name)
        twin = getattr(sys.modules[stage.__module__], f"{name}_twin", None)
        found[name] = [stage] + ([twin] if twin is not None else [])
    return found


@pytest.mark.parametrize("backend", ["reference", "torch_cuda", "mlx"])
def test_every_implementation_takes_the_declared_parameters(backend):
    """A stage's signature is declared once (core/stages.py); KernelStages passes its arguments by
    those names (core/ops._kernel_stage) and callers pass them by position: every implementation
    takes the declared parameters in the declared order, its own extras (use_kernel, with_colsum)
    only with defaults."""
    wrong = []
    for name, functions in _implementations(backend).items():
        declared = list(
            inspect.signature(getattr(H2OStageOps, name, None) or getattr(ScoringStageOps, name)).parameters
        )
        for function in functions:
            parameters = inspect.signature(function).parameters
            extras = [p for p in parameters.values() if p.name not in declared]
            if [p for p in parameters if p in declared] != declared[1:] or any(p.default is p.empty for p in extras):
                wrong.append(f"{function.__module__}.{function.__qualname__}{inspect.signature(function)}")
    assert not wrong, wrong
