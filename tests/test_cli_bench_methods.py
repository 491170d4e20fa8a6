"""`specfill bench --methods` rows beyond full / H2O / SpecPrefill on a tiny model: the composition
by name and `auto` (what it resolves to, calibrated before the clock)."""

import json

import pytest

from specfill.cli.main import main

pytest.importorskip("torch")


def test_bench_runs_the_composition_by_name(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """--methods specprefill+h2o: SpecPrefill over an H2O speculator, its rows named so, and auto's
    calibration of it refreshed under its own name (the probe's timing replaced: no timing here)."""
    from specfill.core import probe

    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.setattr(probe, "_measure", lambda lm, method, length, cached=0: (1.0, 0.5))
    model = str(tiny_checkpoint("llama", "gguf"))
    args = ["bench", "--backends", "cuda", "--device", "cpu", "--model", model, "--lengths", "24", "--decode-tokens"]
    args += ["2", "--speculator", "self:1", "--keep", "0.25", "--select-chunk", "4", "--out", str(tmp_path)]
    assert main([*args, "--methods", "full,specprefill+h2o"]) == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["full", "specprefill+h2o"]
    assert [c["method"] for c in data["calibration"]] == ["specprefill+h2o"]
    assert list((tmp_path / "calibration").glob("cuda-specprefill+h2o-*.json"))
    assert main([*args, "--methods", "full,specprefill+dense"]) == 2
    assert "unknown method 'specprefill+dense'" in capsys.readouterr().err


def test_bench_times_auto_after_its_calibration(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """--methods auto: each length's auto row runs what auto resolves to on this machine, its
    calibrations made before the clock runs (no probe inside a timed run), the method it ran named."""
    from specfill.core import probe

    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (24, 40))
    monkeypatch.setattr(probe, "AUTO_COMPOSITION_FROM", 10**6)  # plain SpecPrefill and H2O weighed
    timed, probed = [], []
    monkeypatch.setattr(probe, "_measure", lambda lm, method, length, cached=0: probed.append(length) or (1.0, 0.5))
    from specfill.evaluation import bench

    one_run = bench._one_run
    monkeypatch.setattr(bench, "_one_run", lambda *a: (timed.append(len(probed)), one_run(*a))[1])
    model = str(tiny_checkpoint("llama", "gguf"))
    args = ["bench", "--backends", "cuda", "--device", "cpu", "--model", model, "--lengths", "24,40"]
    args += ["--decode-tokens", "2", "--speculator", "self:1", "--select-chunk", "4", "--out", str(tmp_path)]
    args += ["--chunk-size", "8", "--batch-size", "8", "--h2o-local", "2", "--h2o-heavy", "2"]
    assert main([*args, "--methods", "full,auto"]) == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = [(r["method"], r["prompt_tokens"], r["ran"]) for r in data["rows"]]
    assert rows == [
        ("full", 24, "full"),
        ("auto", 24, "specprefill"),
        ("full", 40, "full"),
        ("auto", 40, "specprefill"),
    ]
    assert probed and timed[-1] == timed[-2] == len(probed)  # the last length's runs probed nothing
    assert "| auto (specprefill) | 40 |" in (tmp_path / "bench.md").read_text()
    assert data["calibration"] == []  # auto's own calibrations are the rows': nothing refreshed for it


def test_bench_saves_its_crossover_for_auto_only_when_asked(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path))
    from specfill.api import load
    from specfill.core import H2OConfig, crossover, probe
    from specfill.core.runtime import PrefillMethod
    from specfill.evaluation.bench import BenchPlan, run_bench

    h2o = H2OConfig(chunk_size=256, batch_size=1024, local=32, heavy=32)  # few chunks: quick at 2048 tokens

    path = str(tiny_checkpoint("llama", "safetensors"))
    plan = BenchPlan(
        backends=("cuda",),
        methods=("full", "h2o"),
        lengths=(1100, 2048),
        model=path,
        decode_tokens=1,
        device="cpu",
        h2o=h2o,
    )
    table, calls = {2048: (1.0, 2.0), 4096: (2.0, 3.0)}, []  # probe._measure's (full s, sparse s), the lengths asked
    monkeypatch.setattr(probe, "_measure", lambda lm, method, length, cached=0: calls.append(length) or table[length])
    result = run_bench(plan, log=lambda line: None)
    assert calls and result["calibration"][0]["auto_source"].startswith("calibrated now")  # re-probed
    model, _ = load(path, backend="cuda", device="cpu")
    key = probe.key_for(model, PrefillMethod("auto", h2o=h2o))
    assert json.loads(crossover.calibration_path(key).read_text())["how"].startswith("probe")
    result = run_bench(BenchPlan(**{**vars(plan), "save_crossover": True}), log=lambda line: None)
    saved = json.loads(crossover.calibration_path(key).read_text())
    assert saved["how"].startswith("specfill bench") and set(saved["points"]) == {"1100", "2048"}
    assert result["calibration"][0]["auto_crossover"] == saved["crossover_tokens"]
