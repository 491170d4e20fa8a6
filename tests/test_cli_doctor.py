"""`specfill doctor`: the report's sections, the kernel skip reasons here, and bad input."""

import json

import pytest

from specfill.cli.main import main
from specfill.core import probe
from specfill.evaluation.doctor import kernel_skip_reason


@pytest.mark.parametrize("backend", ["cuda", "mlx"])
def test_doctor_writes_its_report(tmp_path, capsys, monkeypatch, backend):
    pytest.importorskip("torch" if backend == "cuda" else "mlx.core")
    # auto's calibration at one length just above H2O's chunk of 1024, not 2K-16K: the same probe, fewer
    # tokens (what a crossover makes of several lengths: tests/test_auto_method.py)
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040,))
    code = main(["doctor", "--backend", backend, "--out", str(tmp_path), "--bench-lengths", "48,96"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "doctor.json").read_text())
    markdown = (tmp_path / "doctor.md").read_text()
    env = report["environment"]
    assert env["packages"]["numpy"] and env["machine"]["cores"] and env["numpy_blas"]
    skip = kernel_skip_reason(backend, env)
    if skip is not None:  # this machine: no CUDA GPU / no Metal, and the report says so
        assert report["kernel_conformance"] == {"skipped": skip}
        assert f"**skipped** — {skip}" in markdown
        assert ("no CUDA GPU" if backend == "cuda" else "no Metal device") in skip
    rows = report["micro_bench"]["rows"]
    assert [(r["method"], r["prompt_tokens"]) for r in rows] == [
        (m, n) for n in (48, 96) for m in ("full", "h2o", "specprefill")
    ]
    assert all(r["ttft_s"] > 0 for r in rows) and "random:tiny-llama-32k" in markdown
    assert "| specprefill | 96 |" in markdown and "attach it to a bug report" in out
    # the micro-bench refreshed auto's calibration for its model on this machine (docs/methods.md#auto)
    assert [c["method"] for c in report["micro_bench"]["calibration"]] == ["h2o", "specprefill"]
    assert '`method="auto"` on this machine, this model: h2o from' in markdown


def test_doctor_bad_input_is_one_line(tmp_path, capsys):
    assert main(["doctor", "--backend", "tpu", "--out", str(tmp_path)]) == 2
    assert main(["doctor", "--bench-lengths", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("specfill: error: ") for line in err)
    assert not (tmp_path / "doctor.json").exists()
