"""The GPU's SM clock, power draw and clock-event reasons, sampled beside scripts/gpu_bench.py (issue 50).

The roofline prices a GPU at its datasheet peak, which it reaches at its boost clock. The attention probe's
candidates run for milliseconds, a 128K prefill for ten seconds: on the H200 (2026-12-04) FlashAttention-4
ran at ~654 TFLOP/s on the probe's shape and the 8B's attention at ~590 over a 128K prompt, by subtraction.
Whether the clock held is this module's to say: `nvidia-smi -lms` writes a sample every PERIOD_MS into a CSV
beside the results, and each bench row gets the samples inside its runs' windows (time.time() at a run's
start and end, `one_run`'s "window"): the median SM clock against the GPU's maximum, the median and peak
power draw, and every clock-event reason seen (nvidia-smi's bit mask in hex: 0x4 the software power cap,
0x8 / 0x40 / 0x80 hardware slowdowns, 0x20 software thermal). Where nvidia-smi is absent (a CPU run) nothing
is sampled and no row says anything of clocks.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

FIELDS = ("timestamp", "clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # the drivers' names, newest first
PERIOD_MS = 100


class Sample(NamedTuple):
    at: float  # seconds since the epoch (nvidia-smi's local time, as time.time() counts)
    sm_mhz: float
    max_sm_mhz: float
    power_w: float
    temperature_c: float
    reasons: int


def parse(text: str) -> list[Sample]:
    """nvidia-smi's CSV lines (no header, no units) -> samples; a line with a field it could not read
    ("[N/A]", a line cut by the stop) is left out."""
    samples = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS) + 1:
            continue
        try:
            at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            numbers = [float(p) for p in parts[1:5]]
            samples.append(Sample(at, *numbers, int(parts[5], 16)))
        except ValueError:
            continue
    return samples


def summary(samples: list[Sample], windows: list[tuple[float, float]]) -> dict | None:
    """The samples inside any of `windows` summarised (None where none falls inside)."""
    inside = [s for s in samples if any(start <= s.at <= end for start, end in windows)]
    if not inside:
        return None
    return {
        "samples": len(inside),
        "sm_clock_mhz": statistics.median(s.sm_mhz for s in inside),
        "sm_clock_min_mhz": min(s.sm_mhz for s in inside),
        "sm_clock_max_mhz": max(s.max_sm_mhz for s in inside),
        "power_w": statistics.median(s.power_w for s in inside),
        "power_peak_w": max(s.power_w for s in inside),
        "temperature_c": max(s.temperature_c for s in inside),
        "reasons": sorted({hex(s.reasons) for s in inside if s.reasons}),
    }


class ClockSampler:
    """nvidia-smi sampling GPU `index` into `path` until stop(), or for `limit_s` at most (under coreutils'
    timeout: a bench killed outright leaves no sampler behind); start() gives None without nvidia-smi, or
    where it answers neither name of the clock-event reasons."""

    def __init__(self, path: Path, process: subprocess.Popen):
        self.path, self.process = path, process

    @classmethod
    def start(cls, path: Path, index: int = 0, limit_s: float = 3600.0) -> ClockSampler | None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        for reasons in REASONS:
            fields = ",".join((*FIELDS, reasons))
            query = [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", f"--id={index}"]
            try:
                if subprocess.run(query, capture_output=True, timeout=30).returncode == 0:
                    break
            except (OSError, subprocess.TimeoutExpired):
                return None
        else:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:  # the child keeps its own descriptor
            bound = ["timeout", f"{max(1, int(limit_s))}"] if shutil.which("timeout") else []
            process = subprocess.Popen(
                [*bound, *query, f"--loop-ms={PERIOD_MS}"], stdout=out, stderr=subprocess.DEVNULL
            )
        return cls(path, process)

    def samples(self) -> list[Sample]:
        return parse(self.path.read_text()) if self.path.exists() else []

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()


def annotate(result: dict, sampler: ClockSampler | None) -> None:
    """Each TTFT row (its runs' windows) and decode row (its last run's window; none where it failed) of a
    gpu_bench result with the samples inside them (`gpu_clocks`), once the sampler has stopped; nothing
    without a sampler."""
    if sampler is None:
        return
    samples = sampler.samples()
    for row in result["rows"]:
        row["gpu_clocks"] = summary(samples, [tuple(r["window"]) for r in row["runs"]])
    for row in result["decode"]:
        row["gpu_clocks"] = summary(samples, [tuple(row["window"])] if "window" in row else [])


def clocks_table(result: dict) -> list[str]:
    """The Markdown table of the rows' clocks, or nothing where no row has any."""
    rows = [(r["method"], r) for r in result["rows"]]
    rows += [(f"decode {d.get('mode')} k={d.get('draft_tokens')}", d) for d in result["decode"]]
    rows = [(name, r) for name, r in rows if r.get("gpu_clocks")]
    if not rows:
        return []
    lines = [
        "",
        f"GPU clocks during each row (nvidia-smi every {PERIOD_MS} ms inside the row's runs; scripts/gpu_clocks.py):",
        "",
        "| row | prompt tokens | samples | SM clock MHz median (min) / max | power W median / peak | max temp C "
        "| clock-event reasons |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in sorted(rows, key=lambda item: item[1]["prompt_tokens"]):
        c = r["gpu_clocks"]
        lines.append(
            f"| {name} | {r['prompt_tokens']} | {c['samples']} | {c['sm_clock_mhz']:.0f} ({c['sm_clock_min_mhz']:.0f})"
            f" / {c['sm_clock_max_mhz']:.0f} | {c['power_w']:.0f} / {c['power_peak_w']:.0f} | {c['temperature_c']:.0f} "
            f"| {', '.join(c['reasons']) or '-'} |"
        )
    return lines
