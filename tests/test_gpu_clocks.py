"""scripts/gpu_clocks.py: nvidia-smi's samples read, each bench row summarised over its own runs' windows,
a table only where there are clocks, and the sampler itself run against a stand-in nvidia-smi (a script on
PATH that answers the query and loops as -lms does). No GPU needed."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_spec = importlib.util.spec_from_file_location("gpu_clocks", SCRIPTS / "gpu_clocks.py")
gpu_clocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_clocks)


def _line(at: float, sm: int, power: float, reasons: str = "0x0000000000000000") -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return f"{stamp}, {sm}, 1980, {power}, 55, {reasons}"


def test_samples_inside_each_rows_windows_are_summarised():
    text = "\n".join(
        [
            _line(100.0, 1980, 300.0),
            _line(101.0, 1755, 690.5, "0x0000000000000004"),  # the software power cap, inside the 128K run
            _line(101.5, 1700, 699.0, "0x0000000000000004"),
            "2026/12/04 17:00:00.000, [N/A], 1980, 80.0, 40, 0x0",  # unreadable: left out
            _line(103.0, 1980, 120.0),  # between the runs
            _line(104.0, 1965, 500.0),
            "garbage",
        ]
    )
    samples = gpu_clocks.parse(text)
    assert len(samples) == 5 and samples[1].reasons == 4
    result = {
        "rows": [
            {
                "method": "full",
                "prompt_tokens": 131008,
                "runs": [{"window": [100.5, 102.0]}, {"window": [103.5, 104.5]}],
            },
            {"method": "h2o", "prompt_tokens": 8192, "runs": [{"window": [200.0, 201.0]}]},  # no sample inside
        ],
        "decode": [{"mode": "graphs", "draft_tokens": 0, "prompt_tokens": 8192, "window": [99.5, 100.5]}],
    }
    sampler = gpu_clocks.ClockSampler.__new__(gpu_clocks.ClockSampler)
    sampler.samples = lambda: samples
    gpu_clocks.annotate(result, sampler)
    full = result["rows"][0]["gpu_clocks"]
    assert full["samples"] == 3 and full["sm_clock_mhz"] == 1755 and full["sm_clock_min_mhz"] == 1700
    assert full["power_peak_w"] == 699.0 and full["reasons"] == ["0x4"] and full["sm_clock_max_mhz"] == 1980
    assert result["rows"][1]["gpu_clocks"] is None
    assert result["decode"][0]["gpu_clocks"]["sm_clock_mhz"] == 1980
    table = "\n".join(gpu_clocks.clocks_table(result))
    assert "| full | 131008 | 3 | 1755 (1700) / 1980 | 690 / 699 | 55 | 0x4 |" in table  # 690.5: half to even
    assert "| decode graphs k=0 | 8192 | 1 | 1980 (1980) / 1980 |" in table and "| h2o |" not in table
    assert gpu_clocks.clocks_table({"rows": result["rows"][1:], "decode": []}) == []
    gpu_clocks.annotate(result, None)  # no sampler: the rows stay as they were
    assert result["rows"][0]["gpu_clocks"] == full


FAKE = """#!{python}
import sys, time, datetime
args = sys.argv[1:]
if any(a.startswith("--query-gpu=") and "clocks_event_reasons" in a for a in args) and "{old}" == "1":
    sys.exit(2)  # an older driver: only the deprecated name
loop = [a for a in args if a.startswith("--loop-ms=")]
while True:
    stamp = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    print(f"{{stamp}}, 1830, 1980, 650.25, 61, 0x0000000000000004", flush=True)
    if not loop:
        break
    time.sleep(int(loop[0].split("=")[1]) / 1000)
"""


@pytest.mark.parametrize("old_driver", [False, True])
def test_the_sampler_runs_nvidia_smi_until_stopped(tmp_path, monkeypatch, old_driver):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(FAKE.format(python=sys.executable, old="1" if old_driver else "0"))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    started = time.time()
    sampler = gpu_clocks.ClockSampler.start(tmp_path / "out" / "ttft_clocks.csv")
    assert sampler is not None
    time.sleep(0.6)
    sampler.stop()
    assert sampler.process.poll() is not None
    samples = sampler.samples()
    assert len(samples) >= 2 and all(s.sm_mhz == 1830 and s.reasons == 4 for s in samples)
    assert started - 1 <= samples[0].at <= time.time() + 1  # nvidia-smi's local time read as time.time()
    bounded = gpu_clocks.ClockSampler.start(tmp_path / "bounded.csv", limit_s=1)
    bounded.process.wait(timeout=10)  # its limit ends it without a stop()
    assert bounded.process.args[:2] == ["timeout", "1"] and len(bounded.samples()) >= 2
    query = next(a for a in sampler.process.args if a.startswith("--query-gpu="))
    assert query.endswith("clocks_throttle_reasons.active" if old_driver else "clocks_event_reasons.active")


def test_no_nvidia_smi_no_sampler(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_clocks.shutil, "which", lambda name: None)
    assert gpu_clocks.ClockSampler.start(tmp_path / "clocks.csv") is None
    assert not (tmp_path / "clocks.csv").exists()
