"""scripts/hybrid_speed.py (issue 36 item 5; gpu_session.sh's hybrid step) smoke-run on its tiny
shape: the checkpoint is built, both parity timings and every method's rows are written (through
evaluation/bench.py's run_bench with its own prompts and no calibration), with the JSON, Markdown
and PNG in place and the shape and speculator stated. Timings themselves are the lead's to measure."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "hybrid_speed.py"
_spec = importlib.util.spec_from_file_location("hybrid_speed", SCRIPT)
hybrid_speed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hybrid_speed)


def test_the_speculator_reaches_an_attention_layer():
    assert hybrid_speed.speculator_layers(hybrid_speed.SHAPES["qwen3.5-0.8b"]) == 6  # a quarter of 24
    assert hybrid_speed.speculator_layers(hybrid_speed.SHAPES["tiny"]) == 2  # layer 1 is its first attention


def test_a_tiny_run_writes_parity_and_method_rows(tmp_path, capsys):
    out = tmp_path / "tiny"
    args = ["--out", str(out), "--shape", "tiny", "--dtype", "float32", "--threads", "1"]
    assert hybrid_speed.main([*args, "--parity-length", "32", "--lengths", "48", "64"]) == 0
    result = json.loads((tmp_path / "tiny.json").read_text())
    assert result["complete"] and result["threads"] == 1 and result["speculator"].startswith("self:2")
    (parity,) = result["parity"]
    assert parity["prompt_tokens"] == 32 and parity["transformers_s"] > 0 and parity["specfill_s"] > 0
    rows = [(r["method"], r["prompt_tokens"]) for r in result["rows"]]
    assert rows == [(m, n) for n in (48, 64) for m in ("full", "h2o", "specprefill")]
    assert all(r["peak_memory_gb"] > 0 and r["ttft_speedup_vs_full"] for r in result["rows"])
    markdown = (tmp_path / "tiny.md").read_text()
    assert "tiny (random weights), float32, cpu, 1 thread(s)" in markdown and "hidden_size=64" in markdown
    assert (tmp_path / "tiny.png").stat().st_size > 0
    assert "parity 32" in capsys.readouterr().out  # the progress lines


def test_a_kept_checkpoint_is_built_once_and_reused_for_its_shape_only(tmp_path, monkeypatch):
    """--checkpoint DIR (gpu_session.sh's hybrid step: one checkpoint for its two runs): built whole into DIR
    (through DIR.part, renamed), reused by a later run of the same shape without a rebuild, refused for another
    shape with one line; a .part left by a stopped run is rebuilt, never read."""
    shape = hybrid_speed.SHAPES["tiny"]
    directory = tmp_path / "model"
    (tmp_path / "model.part").mkdir()
    (tmp_path / "model.part" / "stale").write_text("a run stopped mid-write")
    assert hybrid_speed.reused_checkpoint(directory, shape) == directory
    assert (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file()
    assert not (directory / "stale").exists() and not (tmp_path / "model.part").exists()
    built = []
    monkeypatch.setattr(hybrid_speed, "build_checkpoint", lambda *a: built.append(a))
    assert hybrid_speed.reused_checkpoint(directory, dict(shape)) == directory and built == []
    with pytest.raises(SystemExit, match="holds no checkpoint of this shape"):
        hybrid_speed.reused_checkpoint(directory, {**shape, "hidden_size": 2 * shape["hidden_size"]})
