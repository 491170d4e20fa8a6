"""The conformance suite under pytest: every registered backend that is available here,
at each of its default dtypes, one test per check group."""

import pytest

from specfill.conformance import CHECK_GROUPS, DEFAULT_DTYPES, REGISTRY, adapter_factory, run_group
from specfill.core import BackendUnavailableError

PARAMS = [(backend, dtype) for backend in REGISTRY for dtype in DEFAULT_DTYPES[backend]]


@pytest.mark.parametrize("group", list(CHECK_GROUPS))
@pytest.mark.parametrize("backend,dtype", PARAMS)
def test_conformance(backend, dtype, group):
    try:
        factory = adapter_factory(backend)
    except BackendUnavailableError as why:
        pytest.skip(str(why))
    results = run_group(factory(dtype=dtype, use_kernels=None), dtype, group)
    failures = [r for r in results if not r.passed]
    assert results, f"{group} produced no checks"
    assert not failures, "\n".join(f"{r.check} [{r.case}]: {r.detail} (err {r.max_error})" for r in failures[:10])
