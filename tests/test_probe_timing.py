"""The probe's timing (core/probe._measure, timed_views, TimedViews.price): what `auto`'s calibration
measures, on the tiny llama; what auto does with it is tests/test_auto_method.py."""

import pytest

from specfill.api import load
from specfill.core import H2OConfig, probe
from specfill.core.runtime import PrefillMethod

SMALL_H2O = H2OConfig(chunk_size=8, batch_size=8, local=2, heavy=2)


@pytest.fixture
def tiny(tiny_checkpoint, tmp_path, monkeypatch):
    """The tiny llama on torch CPU with an empty calibration cache of its own."""
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path / "calibration"))
    return load(str(tiny_checkpoint("llama", "safetensors")), backend="cuda", device="cpu", dtype="float32")


@pytest.mark.parametrize("backend", ["cuda", "mlx"])
def test_the_probe_times_a_turn_over_its_cached_prefix(tiny_checkpoint, monkeypatch, backend):
    """probe._measure with cached > 0, on either backend: each view's dense cache of the prefix is
    prefilled once (from position 0), then every timed run (full, H2O's walk, SpecPrefill's speculator
    and kept tokens) prefills only the new part, from position `cached`, on a copy of it."""
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    device = {"device": "cpu"} if backend == "cuda" else {}
    model, _ = load(str(tiny_checkpoint("llama", "safetensors")), backend=backend, dtype="float32", **device)
    real_prefill, real_spec = probe.prefill, probe.speculative_prefill
    starts: list[tuple[int, int]] = []  # (first position, tokens) of every prefill the probe runs itself
    reuses: list[tuple[int, int, int]] = []  # SpecPrefill's (reused, speculator cache tokens, its filled slots)

    def spy_prefill(ops, view, ids, positions, cache, **kw):
        starts.append((positions, ids.shape[0]))
        return real_prefill(ops, view, ids, positions, cache, **kw)

    def spy_spec(*args, reused=0, main_cache=None, speculator_cache=None, **kw):
        reuses.append((reused, speculator_cache[1], speculator_cache[0].filled))
        return real_spec(*args, reused=reused, main_cache=main_cache, speculator_cache=speculator_cache, **kw)

    monkeypatch.setattr(probe, "prefill", spy_prefill)
    monkeypatch.setattr(probe, "speculative_prefill", spy_spec)
    # the views seeded: the main model's two (H2O); with the self speculator's two (of the main model's layers), four
    for method, views in ((PrefillMethod("auto", h2o=SMALL_H2O), 2), (PrefillMethod("auto", speculator="self:1"), 4)):
        starts.clear()
        full, sparse = probe._measure(model, method, 64, cached=128)
        assert 0 < full < float("inf") and 0 < sparse < float("inf")
        assert [s for s in starts if s[0] == 0] == [(0, 128)] * views  # each view's cache of the prefix, once
        assert all(s == (128, 64) for s in starts if s[0] != 0)  # every timed run: the new part only
        assert len(starts) > views
    assert reuses and all(r == (128, 128, 128) for r in reuses)


def test_the_probe_times_layers_that_compute_every_row(tiny, monkeypatch):
    """A model's last layer computes only the rows something reads (core/ops.last_rows): the probe's
    views (probe.timed_views: the first k layers and the first 2k) differ by k layers none of which is
    cut to its read rows (a view ending at the timed layer priced the 1.5B's full prefill ~8x under
    the real one); each view's last layer is cut, as the whole model's is."""
    from specfill.backends.torch_cuda import model as torch_model

    model, _ = tiny
    real, cut = torch_model.last_rows, []

    def spy(steps, logits_from, attend, layer, end):
        rows = real(steps, logits_from, attend, layer, end)
        cut.append(layer)
        return rows

    monkeypatch.setattr(torch_model, "last_rows", spy)
    k = probe.timed_layers(model.args)
    views = probe.timed_views(model.ops, model.model, model.args)
    assert (views.long.args.num_hidden_layers, views.short.args.num_hidden_layers, views.k) == (2 * k, k, k)
    assert model.args.num_hidden_layers >= 2 * k
    for method in (PrefillMethod("auto", h2o=SMALL_H2O), PrefillMethod("auto", speculator="self:1")):
        cut.clear()
        probe._measure(model, method, 64)
        assert cut and set(cut) == {k - 1, 2 * k - 1}  # only each view's last layer computes fewer rows


def test_a_models_seconds_are_its_first_layers_plus_the_per_layer_seconds_of_the_rest():
    """TimedViews.price: what the short view takes (embedding, LM heads: the speculator's 8 look-ahead
    ones, the cheap last layer) counts once, the layers' own seconds (long - short) / k per further
    layer; scaling a view's whole time by the layer count priced the 0.5B speculator's pass 1.5x over
    the real one (core/probe.py). Without a short view (the long one is the whole model): its share
    per layer."""
    views = probe.TimedViews(long="2k layers", short="k layers", k=2)
    assert views.price(5.0, 1.0, 24) == pytest.approx(1.0 + 22 * 2.0)
    assert views.per_layer(5.0, 1.0) == 2.0
    assert views.price(5.0, 1.0, 4) == 5.0 and views.price(5.0, 1.0, 2) == 1.0  # the views' own seconds
    whole = probe.TimedViews(long="the model", short=None, k=4)
    assert whole.price(8.0, 123.0, 4) == 8.0 and whole.price(8.0, 123.0, 2) == 4.0


def test_a_lengths_ratio_is_the_median_of_paired_runs(monkeypatch):
    """probe._paired_times runs full then sparse REPEATS times and keeps each pair together: full's median
    seconds and the sparse method's at the pairs' median ratio. The fastest of each run on its own
    sets a full run from one moment against a sparse run from another (here 1.5 / 4 = 0.375, where
    two pairs of three read 0.75): how a 2-core VM's calibration once ranked plain SpecPrefill
    before the composition."""
    monkeypatch.setattr(probe, "REPEATS", 3)
    order: list[str] = []
    fulls, sparses = iter([8.0, 4.0, 10.0]), iter([6.0, 3.0, 1.5])  # pairs read 0.75, 0.75, 0.15

    def full_run() -> float:
        order.append("full")
        return next(fulls)

    def sparse_run() -> float:
        order.append("sparse")
        return next(sparses)

    full, sparse = probe._paired_times(full_run, sparse_run)
    assert order == ["full", "sparse"] * 3  # interleaved: each pair run back to back
    assert full == 8.0 and sparse == pytest.approx(6.0)  # 8 x the median ratio 0.75
