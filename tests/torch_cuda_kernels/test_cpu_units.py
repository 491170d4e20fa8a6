"""Work units of the torch twins on CPU threads: same results at any thread count, settings restored."""

import threading

import pytest
import torch

from specfill.backends.torch_cuda.kernels import cpu_units, inter, intra

from .torch_stages_support import randn

CPU = torch.device("cpu")


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def test_units_run_once_each_on_single_threaded_ops(two_threads):
    seen: dict[int, tuple[str, int]] = {}
    lock = threading.Lock()

    def unit(index: int) -> None:
        with lock:
            assert index not in seen
            seen[index] = (threading.current_thread().name, torch.get_num_threads())

    cpu_units.run_units(unit, 9, CPU)
    assert sorted(seen) == list(range(9))
    assert {threads for _, threads in seen.values()} == {1}
    assert torch.get_num_threads() == 2  # the caller's setting is back


def test_a_failing_unit_raises_and_restores_the_thread_count(two_threads):
    def unit(index: int) -> None:
        if index == 5:
            raise RuntimeError("unit 5 failed")

    with pytest.raises(RuntimeError, match="unit 5 failed"):
        cpu_units.run_units(unit, 8, CPU)
    assert torch.get_num_threads() == 2


def test_scope_nests_and_keeps_the_outer_thread_budget(two_threads):
    with cpu_units.units_scope(CPU):
        assert torch.get_num_threads() == 1
        with cpu_units.units_scope(CPU):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
        ran: list[int] = []
        cpu_units.run_units(ran.append, 64, CPU)  # spread over the 2 threads of the outer setting
        assert sorted(ran) == list(range(64)) and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_full_width_gives_one_fused_op_the_callers_threads(two_threads):
    with cpu_units.full_width(CPU):  # outside any scope: nothing to change
        assert torch.get_num_threads() == 2
    with cpu_units.units_scope(CPU):
        with cpu_units.full_width(CPU):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError, match="inside"):
            with cpu_units.full_width(CPU):
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("block", [8, 64])
def test_twins_give_the_same_bits_with_one_or_two_threads(monkeypatch, block):
    monkeypatch.setattr(intra, "_TWIN_QUERY_BLOCK", block)
    monkeypatch.setattr(inter, "_TWIN_QUERY_BLOCK", block)
    q, k, v = (randn(h, 90, 16, dtype=torch.float32, seed=s) for s, h in enumerate((6, 2, 2)))
    k_mem, v_mem = (randn(2, 21, 16, dtype=torch.float32, seed=s) for s in (7, 8))
    previous = torch.get_num_threads()
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            results.append(
                (intra.intra_attention_twin(q, k, v, 25, 0.3), inter.inter_attention_twin(q, k_mem, v_mem, 0.3))
            )
        finally:
            torch.set_num_threads(previous)
    for one, two in zip(*results):
        for a, b in zip(
            [one.state.m, one.state.l, one.state.o, one.colsum], [two.state.m, two.state.l, two.state.o, two.colsum]
        ):
            assert torch.equal(a, b)


def test_pool_threads_take_the_callers_inference_mode(two_threads):
    """The model prefills in inference mode: pool threads write into inference tensors too."""
    out = torch.zeros(6)
    modes: set[tuple[bool, bool]] = set()

    def unit(index: int) -> None:
        modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        out[index] = index

    with torch.inference_mode():
        buffer = torch.zeros(64)
        cpu_units.run_units(lambda i: buffer.__setitem__(i, i), 64, CPU)
        cpu_units.run_units(unit, 6, CPU)
    assert buffer.tolist() == list(range(64)) and modes == {(True, False)}
    with torch.no_grad():
        modes.clear()
        cpu_units.run_units(unit, 6, CPU)
    assert modes == {(False, False)}
