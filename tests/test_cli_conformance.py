"""`specfill conformance`: reports written, exit codes, one-line errors."""

import json
import subprocess
import sys

from specfill.cli.main import main
from specfill.conformance import REGISTRY, ReferenceAdapter


class DecodeStartsAtKeptCount(ReferenceAdapter):
    def select_tokens(self, importance, config):
        good = super().select_tokens(importance, config)
        return type(good)(good.kept, good.position_ids, len(good.kept), good.chunk_scores)


def test_reference_passes_and_writes_both_reports(tmp_path, capsys):
    assert main(["conformance", "--backend", "reference", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "conformance-reference.json").read_text())
    assert data["passed"] is True and data["n_failed"] == 0 and data["n_checks"] > 700
    assert set(data["dtypes"]) == {"float64", "float32"}
    assert {"h2o.layer.output_vs_key_sets", "specprefill.select_tokens.position_ids"} <= {
        r["check"] for r in data["results"]
    }
    markdown = (tmp_path / "conformance-reference.md").read_text()
    assert "— PASS" in markdown and "## Tolerances" in markdown
    assert "PASS" in capsys.readouterr().out


def test_failing_backend_exits_1_and_lists_failures(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(REGISTRY, "planted", DecodeStartsAtKeptCount)
    assert main(["conformance", "--backend", "planted", "--dtype", "float64", "--out", str(tmp_path)]) == 1
    assert "FAIL specprefill.select_tokens.decode_start" in capsys.readouterr().out
    assert json.loads((tmp_path / "conformance-planted.json").read_text())["passed"] is False
    assert "## Failures" in (tmp_path / "conformance-planted.md").read_text()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (
        ["--backend", "nope"],
        ["--backend", "reference", "--dtype", "float8"],
        ["--backend", "reference", "--dtype", "bfloat16"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "specfill.cli.main", "conformance", *args, "--out", str(tmp_path)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("specfill: error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
