"""The GPU session's diagnosis tools on the CPU: scripts/gpu_profile.py's tables (the Python stacks behind
each operator, where the host waited on the device) and the bench's decode rows' graph state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_profile_writes_its_tables(tmp_path):
    """scripts/gpu_profile.py (where a GPU run's time goes) on the CPU with tiny models: one
    section per method and length and per decode mode, each with both tables, the second naming the
    lines of ours that launched each operator (torch records stacks only with its verbose config)."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_profile.py"), "--model", "random:tiny-llama"]
        + ["--speculator", "random:tiny-llama-32k", "--tokens", "64,48"]
        + ["--decode-prompt", "32", "--decode-tokens", "2"]
        + ["--methods", "full,specprefill", "--dtype", "float32", "--device", "cpu", "--out", str(tmp_path)]
        + ["--decode-modes", "graphs,eager"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "profile.md").read_text()
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## full, 64 tokens, 1 new",
        "## specprefill, 64 tokens, 1 new",
        "## full, 48 tokens, 1 new",
        "## specprefill, 48 tokens, 1 new",
        "## decode graphs (full prefill + plain decode), 32 tokens, 2 new",
        "## decode eager (full prefill + plain decode), 32 tokens, 2 new",
    ]
    assert text.count("### by operator\n") == 6 and text.count("Python stack") == 6 and "aten::mm" in text
    assert text.count("Source Location") == 6 and "backends/torch_cuda/model.py(" in text


def test_gpu_profile_counts_waits_at_our_lines(monkeypatch):
    """gpu_profile's host waits are counted at the innermost line of this checkout that made them
    (the checkout's virtual environment and torch's own frames passed over)."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import traceback
    from collections import Counter

    import gpu_profile

    def frame(path, line, name):
        return traceback.FrameSummary(str(path), line, name)

    ours = frame(ROOT / "core" / "methods" / "specprefill.py", 171, "run_speculator")
    venv = frame(ROOT / ".venv" / "lib" / "torch" / "_tensor.py", 10, "item")
    torch_frame = frame("/usr/lib/python3/torch/cuda/__init__.py", 5, "synchronize")
    assert gpu_profile.our_line([ours, venv, torch_frame]) == "core/methods/specprefill.py:171 (run_speculator)"
    assert gpu_profile.our_line([torch_frame]) == "(outside the checkout)"
    table = gpu_profile.waits_table(Counter({"a.py:1 (f)": 2, "b.py:3 (g)": 5}), 10)
    assert table[2:] == ["| 5 | b.py:3 (g) |", "| 2 | a.py:1 (f) |"]
    assert gpu_profile.waits_table(Counter(), 10) == ["(none)"]


def test_gpu_bench_rows_say_how_decode_steps_were_captured(monkeypatch):
    """A decode row's graph state: nothing where steps are not captured; else whether a capture failed and
    whether new prompts' first steps were still captured without their eager run."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from types import SimpleNamespace

    import gpu_bench_report

    from specfill.backends.torch_cuda.decode_graph import DecodeGraphs

    assert gpu_bench_report.graph_state(SimpleNamespace(decode_graphs=None)) == {
        "capture_failed": None,
        "capture_first": None,
    }
    eager = SimpleNamespace(decode_graphs=DecodeGraphs(None))  # eager-static: nothing captured
    assert gpu_bench_report.graph_state(eager)["capture_first"] is None
    graphs = DecodeGraphs(capture=object())
    graphs.capture_first = False
    graphs.refused.add((1, 1, ()))
    assert gpu_bench_report.graph_state(SimpleNamespace(decode_graphs=graphs)) == {
        "capture_failed": True,
        "capture_first": False,
    }
