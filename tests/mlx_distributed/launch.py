"""Run a script on two ranks of this machine with `mlx.launch --backend ring -n 2 --hosts 127.0.0.1`,
bounded in time (the whole process group is killed at the limit), and the reason to skip where
mlx.launch or the ring back-end is unavailable here."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# each launch: two processes importing mlx-lm, loading a tiny model, generating (13-23 s alone on
# two cores; the ranks run niced, so beside another test worker (`make test`) about twice that)
LAUNCH_LIMIT_S = 120
RANKS = 2


@dataclass
class Launched:
    returncode: int | None  # None: killed at the limit
    output: str  # stdout and stderr of every rank and of mlx.launch
    seconds: float


def launcher() -> Path | None:
    """mlx.launch next to this interpreter (the virtual environment's), else on PATH."""
    beside = Path(sys.executable).parent / "mlx.launch"
    if beside.exists():
        return beside
    from shutil import which

    found = which("mlx.launch")
    return Path(found) if found else None


def free_port_pair() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 (the ring listens on one port per rank)."""
    for _ in range(50):
        port = random.randint(20000, 60000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair on 127.0.0.1")


def ring_command(launcher: Path, script: list[str], ranks: int = RANKS, env: dict[str, str] | None = None) -> list[str]:
    """mlx.launch's command line running `script` (a Python file and its arguments) on `ranks` ring
    ranks on 127.0.0.1 with this interpreter ("--": the script's options are not the launcher's)."""
    command = [str(launcher), "--backend", "ring", "-n", str(ranks), "--hosts", "127.0.0.1"]
    command += ["--starting-port", str(free_port_pair()), "--python", sys.executable]
    for key, value in (env or {}).items():
        command += ["--env", f"{key}={value}"]
    return [*command, "--", *script]


def start(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`script args` on RANKS ring ranks on 127.0.0.1 (niced: this machine is shared), in a process
    group of its own (killed whole at a limit), output piped."""
    command = ["nice", "-n", "19", *ring_command(launcher(), [str(script), *args], RANKS, env)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def rank_pid(process: subprocess.Popen, rank: int) -> int | None:
    """The pid of rank `rank` among the processes `start` made (its process group; MLX_RANK)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != process.pid:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        if f"MLX_RANK={rank}".encode() in environ and b"python" in (entry / "cmdline").read_bytes():
            return int(entry.name)
    return None


def kill(process: subprocess.Popen) -> None:
    """The launcher and the ranks it started (all ours: their own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(script: Path, *args: str, limit_s: float = LAUNCH_LIMIT_S, env: dict[str, str] | None = None) -> Launched:
    """`script args` on RANKS ring ranks on 127.0.0.1, bounded by limit_s."""
    started = time.monotonic()
    process = start(script, *args, env=env)
    try:
        output, _ = process.communicate(timeout=limit_s)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        kill(process)
        output, _ = process.communicate()
        code = None
    return Launched(code, output, time.monotonic() - started)


_REASON: list[str | None] = []


def unavailable() -> str | None:
    """Why two ring ranks cannot run here (None: they can): no MLX, no distributed back-end in this
    MLX build, no mlx.launch, or a 5-line all_sum on two ranks that does not give 3 (once per session)."""
    if _REASON:
        return _REASON[0]
    reason = None
    try:
        import mlx.core as mx
    except ImportError:
        reason = "MLX is not installed"
    else:
        if not mx.distributed.is_available("ring"):
            reason = "this MLX build has no ring distributed back-end"
        elif launcher() is None:
            reason = "mlx.launch is not installed"
        else:
            run = launch(HERE / "all_sum.py", limit_s=30)
            if run.output.count("all_sum 3.0") != RANKS:
                tail = run.output.strip().splitlines()[-1:] or ["no output"]
                reason = f"mlx.launch --backend ring -n 2 --hosts 127.0.0.1 did not run here: {tail[0][:160]}"
    _REASON.append(reason)
    return reason
