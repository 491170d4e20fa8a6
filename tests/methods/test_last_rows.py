"""The model's last layer computes only the rows something reads (core/ops.last_rows): the rows
whose logits are asked for and the queries its attention must see (the speculator's window and
look-ahead, every query of an H2O layer); every row's keys and values are still cached. Checked
on every installed backend: the rows the last layer's MLP receives, and every result equal to the
run that computes all rows (the baseline: `queries_from` answering 0, logits asked from row 0).

Tolerance: 1e-5 absolute on float32 logits and queries of unit-scale tiny models: the rows kept are
the same function of the same inputs; only the attention kernel's query count and the matmuls' row
blocking differ (rounding ~1e-7 per op).
"""

from __future__ import annotations

import numpy as np
import pytest

from specfill.core.config import H2OConfig
from specfill.core.methods import h2o as h2o_method
from specfill.core.methods import specprefill
from specfill.core.methods.h2o import h2o_prefill
from specfill.core.methods.prefill import prefill
from specfill.core.methods.specprefill import run_speculator
from tests.methods.support import prompt

TOL = 1e-5
N = 66  # prompt tokens; steps of 32: 32, 64, 66 (a 4-token window spans the last two steps)


@pytest.fixture
def mlp_rows(backend, monkeypatch):
    """Every MLP call's row count, in call order (the backend's MLP class wrapped)."""
    rows: list[int] = []
    if backend == "cuda":
        from specfill.backends.torch_cuda import model as module

        inner = module.MLP.forward
        monkeypatch.setattr(module.MLP, "forward", lambda self, x: (rows.append(x.shape[1]), inner(self, x))[1])
    else:
        from specfill.backends.mlx import model as module

        inner = module.MLP.__call__
        monkeypatch.setattr(module.MLP, "__call__", lambda self, x: (rows.append(x.shape[1]), inner(self, x))[1])
    return rows


def numpy(model, x) -> np.ndarray:
    return np.asarray(model.ops.to_numpy(x), dtype=np.float64)


def all_rows(monkeypatch) -> None:
    """The baseline: every attention wants every query (the last layer computes every row)."""
    for cls in (specprefill.QueryCapture, h2o_method.H2OPrefillAttention):
        monkeypatch.setattr(cls, "queries_from", lambda self, layer, steps, end: 0)


def test_full_prefill_computes_the_last_layer_for_the_logits_rows_only(tiny, mlp_rows):
    t = tiny("qwen2")
    model, ops, n_layers = t.model.model, t.model.ops, t.args.num_hidden_layers
    mlp_rows.clear()  # the load's self-check
    ids = ops.tokens(np.array(prompt(N, t.args.vocab_size, seed=5)))
    cache = ops.new_cache(model, N)
    last = prefill(ops, model, ids, 0, cache, step_size=32)
    # steps of 32, 32, 2: the last layer computes no row of the first two, the last token of the third
    assert mlp_rows[n_layers - 1 :: n_layers] == [0, 0, 1]
    assert all(r == s for i, (r, s) in enumerate(zip(mlp_rows, [32] * n_layers + [32] * n_layers + [2] * n_layers))
               if i % n_layers != n_layers - 1)  # fmt: skip
    mlp_rows.clear()
    every = prefill(ops, model, ids, 0, ops.new_cache(model, N), step_size=32, logits_from=0)
    assert mlp_rows[n_layers - 1 :: n_layers] == [32, 32, 2]
    assert np.abs(numpy(t.model, last)[-1] - numpy(t.model, every)[-1]).max() < TOL
    assert [layer.offset for layer in cache.layers] == [N] * n_layers  # every row's keys and values


def test_logits_from_a_middle_row(tiny, mlp_rows):
    """A verify step's rows (logits from row r): the last layer computes rows r.. and the logits
    equal those of the all-rows step."""
    t = tiny("llama")
    model, ops, n_layers = t.model.model, t.model.ops, t.args.num_hidden_layers
    mlp_rows.clear()  # the load's self-check
    ids = ops.tokens(np.array(prompt(12, t.args.vocab_size, seed=6)))
    tail = ops.forward(model, ids, 0, ops.new_cache(model, 12), None, 7)
    assert mlp_rows[n_layers - 1] == 5
    every = ops.forward(model, ids, 0, ops.new_cache(model, 12), None, 0)
    assert np.abs(numpy(t.model, tail) - numpy(t.model, every)[7:]).max() < TOL


@pytest.mark.parametrize("dense_tail", [None, 4, 0], ids=["dense", "h2o-tail4", "h2o-tail0"])
def test_the_speculator_computes_its_window_and_lookahead_rows(tiny, mlp_rows, monkeypatch, dense_tail):
    """The speculator's last layer computes the window's rows (here spanning two prefill steps) and
    the look-ahead's; with H2O in every layer too, since H2O's dense tail (W >= 1) gives its last
    prompt row the dense output the walk would: the layer's walk is skipped. Without a tail (W = 0)
    that layer walks every row. Queries, look-ahead and keys equal the all-rows run's (the walk)."""
    t = tiny("qwen3")
    model, ops, n_layers = t.model.model, t.model.ops, t.args.num_hidden_layers
    ids = np.array(prompt(N, t.args.vocab_size, seed=7))
    h2o = None
    if dense_tail is not None:
        h2o = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, dense_tail=dense_tail, layers="all")

    def run():
        mlp_rows.clear()
        done = run_speculator(ops, model, ids, lookahead=3, stop_ids=frozenset(), step_size=32, query_window=4, h2o=h2o)
        return done, list(mlp_rows)

    mlp_rows.clear()  # the load's self-check
    fast, rows = run()
    step = 32 if h2o is None else h2o_prefill(ops, h2o, t.args, N, 32)[1]
    bounds = [(lo, min(lo + step, N)) for lo in range(0, N, step)]
    if dense_tail == 0:  # every row of the walk's steps
        want = [hi - lo for lo, hi in bounds]
    else:  # the window's 4 rows (the last 4 prompt tokens), wherever the steps cut them
        want = [max(0, hi - max(lo, N - 4)) for lo, hi in bounds]
    assert rows[n_layers - 1 :: n_layers] == want + [1, 1, 1]  # then each look-ahead token's row
    all_rows(monkeypatch)
    slow, _ = run()
    assert fast.lookahead == slow.lookahead
    assert np.abs(numpy(t.model, fast.queries) - numpy(t.model, slow.queries)).max() < TOL
    assert np.abs(numpy(t.model, fast.keys) - numpy(t.model, slow.keys)).max() < TOL


def test_h2o_in_the_last_layer_sees_every_query(tiny, mlp_rows, monkeypatch):
    """H2O with its last layer sparse: that layer computes every row (the heavy-hitter scores need
    every query); with the default layers (the first third) it computes the logits row only."""
    t = tiny("llama")
    model, ops, n_layers = t.model.model, t.model.ops, t.args.num_hidden_layers
    mlp_rows.clear()  # the load's self-check
    ids = ops.tokens(np.array(prompt(N, t.args.vocab_size, seed=8)))
    outs = {}
    for layers in ("all", "first-0.33"):
        config = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, layers=layers)
        attend, step = h2o_prefill(ops, config, t.args, N, 32)
        mlp_rows.clear()
        outs[layers] = prefill(ops, model, ids, 0, ops.new_cache(model, N), step_size=step, attend=attend)
        last = mlp_rows[n_layers - 1 :: n_layers]
        if layers == "all":
            assert last == [min(step, N - lo) for lo in range(0, N, step)]
        else:
            assert last[:-1] == [0] * (len(last) - 1) and last[-1] == 1
    all_rows(monkeypatch)
    for layers in ("all", "first-0.33"):
        config = H2OConfig(chunk_size=16, batch_size=32, local=3, heavy=3, layers=layers)
        attend, step = h2o_prefill(ops, config, t.args, N, 32)
        every = prefill(ops, model, ids, 0, ops.new_cache(model, N), step_size=step, attend=attend, logits_from=0)
        assert np.abs(numpy(t.model, outs[layers])[-1] - numpy(t.model, every)[-1]).max() < TOL, layers
