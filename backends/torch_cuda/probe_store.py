"""The attention probe's choices kept on disk (attention_choice.py), so that a new process on the same GPU
and software does not probe again.

A probe times every candidate of a kind, and compiles each first (Triton's variants; FlashAttention-4's
CuTe kernels, seconds each): in every process, every CLI run included, and in every step of the GPU
session. What it chose is kept as a calibration file (core/crossover.py: calibration_path, beside the
crossover calibration and the drafting costs, cuda-attention-probe-<digest>.json) whose key is the
environment it was measured in: the GPU's name and capability, its driver, torch with its CUDA and cuDNN, Triton,
FlashAttention-4, the kernel setting and a digest of the kernels' sources; another environment has a file
of its own. A recalled choice is run through the probe again alone, its correctness check and its timing,
so a kernel that fails or errs now is dropped there and every candidate is probed. The file is written
whole or not at all (write_calibration). To probe again, delete it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from specfill.core.crossover import calibration_path, write_calibration

from . import placement

STORE_VERSION = 1
log = logging.getLogger("specfill.backends.torch_cuda")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


# the kernel module's first line: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
# (Linux; torch names no driver version, and a container sees the host's module here)
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")


def driver_version() -> str:
    """The NVIDIA kernel driver's version where Linux shows it (a new driver may make another kernel
    the fastest); "" where it cannot be read."""
    try:
        first = DRIVER_VERSION_FILE.read_text(encoding="utf-8", errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return ""
    found = re.search(r"\s(\d+\.\d+(?:\.\d+)*)\s", f" {first} ")  # the proprietary module's line or the open one's
    return found.group(1) if found else first.strip()


@cache
def _sources() -> str:
    """A digest of the probe's and the kernels' sources: a changed kernel is probed again."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted([here / "attention_choice.py", *(here / "kernels").glob("*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def environment(device: torch.device) -> dict[str, Any]:
    """What a choice on `device` depends on (the module doc), as a calibration key (its file:
    core/crossover.calibration_path)."""
    from specfill.core.self_check import kernels_setting

    gpu = placement.RUNTIME.properties(device)
    return {
        "backend": "cuda",
        "method": "attention-probe",
        "version": STORE_VERSION,
        "gpu": gpu.name,
        "capability": list(gpu.capability),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "driver": driver_version(),
        "triton": _version("triton"),
        "flash-attn-4": _version("flash-attn-4"),
        "kernels": str(kernels_setting(None)),
        "sources": _sources(),
    }


def _read(env: dict[str, Any]) -> dict[str, Any]:
    """The stored choices of `env`; none where the file is missing, unreadable or of another environment."""
    try:
        data = json.loads(calibration_path(env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("key") != env or not isinstance(data.get("choices"), dict):
        return {}
    return data["choices"]


def recall(env: dict[str, Any], key: str, offered: list[str]) -> dict[str, Any] | None:
    """The stored choice {"chosen", "report", "probed_at"} of `key` where it was made among the same
    candidates `offered` (sorted names) in the environment `env`; else None."""
    entry = _read(env).get(key)
    if not isinstance(entry, dict) or entry.get("offered") != offered or entry.get("chosen") not in offered:
        return None
    return entry


def remember(env: dict[str, Any], key: str, offered: list[str], chosen: str, report: dict[str, str]) -> None:
    """Keep `chosen` (and the probe's report) for `key` in the file of the environment `env`, written
    whole (crossover.write_calibration). A file that cannot be written is left as it was (logged)."""
    choices = _read(env)
    choices[key] = {
        "chosen": chosen,
        "offered": offered,
        "report": report,
        "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        write_calibration(env, {"key": env, "choices": choices})
    except OSError as e:
        log.warning("the attention probe's choice is not kept (%s: %s)", type(e).__name__, e)


def remembered(
    key: tuple, device: torch.device, run: Callable[[Any], tuple[str, Any, dict[str, str]]], offered: Callable[[], dict]
) -> Any:
    """attention_choice's (name, kernel, report) for `key` (its _CHOSEN key, stored without `device`) on
    `device`: run(None) probes every candidate; on a CUDA device a choice kept by an earlier process in
    this environment (recall) is probed alone instead, run({name: kernel}): its correctness check and
    timing again, the other candidates of `offered()` neither compiled nor timed. A recalled kernel that
    fails or errs now is dropped and every candidate probed; a new choice is kept."""
    if not placement.on_cuda(device):
        return run(None)
    kernels = offered()
    names = sorted(kernels)
    env = environment(device)  # the GPU is the environment's: the key without its device
    stored_as = repr(tuple(part for part in key if part != device))
    entry = recall(env, stored_as, names)
    if entry is not None:
        try:
            name, kernel, report = run({entry["chosen"]: kernels[entry["chosen"]]})
        except RuntimeError:  # no longer correct or no longer runs: every candidate again
            pass
        else:
            said = f"{report[name]} (checked again alone; every candidate was probed {entry['probed_at']})"
            return name, kernel, {**entry["report"], **report, name: said}  # its shape and rate now
    name, kernel, report = run(kernels)
    remember(env, stored_as, names, name, report)
    return name, kernel, report
