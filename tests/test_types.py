"""mypy over the product (core, backends, conformance, cli, evaluation, specfill) as the installed
`specfill` package, configured in pyproject.toml ([tool.mypy]): a call to a method that does not
exist, or with arguments it does not take, fails here and not in a user's server.

The folders at the repository root are sub-packages of `specfill` (pyproject's package-dir), which
mypy cannot map: it reads a tree of links laid out as the installed package (.mypy_cache/tree). Its
cache lives in .mypy_cache (a cold run on a fresh clone takes ~30 s of CPU, a warm one seconds)."""

import subprocess
import sys
from pathlib import Path

from tests.package_layout import PACKAGE_DIRS, ROOT

# specfill's sub-packages in folders of their own at the root (pyproject's package-dir): name -> folder
SUBPACKAGES = {
    package.removeprefix("specfill."): ROOT / folder
    for folder, package in PACKAGE_DIRS.items()
    if package != "specfill"
}
CACHE = ROOT / ".mypy_cache"


def package_tree() -> Path:
    """.mypy_cache/tree/specfill: links to specfill/'s entries and to the root folders it maps."""
    tree = CACHE / "tree"
    package = tree / "specfill"
    package.mkdir(parents=True, exist_ok=True)
    wanted = {e.name: e for e in (ROOT / "specfill").iterdir() if e.name != "__pycache__"}
    wanted.update(SUBPACKAGES)
    for link in package.iterdir():
        if link.name not in wanted or not link.is_symlink() or link.resolve() != wanted[link.name].resolve():
            link.unlink()
    for name, target in wanted.items():
        if not (package / name).is_symlink():
            (package / name).symlink_to(target)
    return tree


def mypy(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE)]
    return subprocess.run(
        [*command, "--python-executable", sys.executable, *args],
        cwd=package_tree(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_mypy_passes_over_the_product():
    done = mypy("-p", "specfill")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_reports_a_call_to_a_missing_method():
    """The configuration catches what the queued-then-cancelled bug was (serve/scheduler.py called
    a method that no longer existed: `_end`, which it has again), in an annotated function and in one
    without annotations."""
    program = (
        "from specfill.serve.scheduler import Scheduler\n"
        "def annotated(s: Scheduler) -> None:\n"
        "    s._finish(None)\n"
        "def plain(s):\n"
        "    Scheduler.submit(s, None, 1)\n"
    )
    done = mypy("-c", program)
    assert done.returncode == 1, done.stdout + done.stderr
    assert '"Scheduler" has no attribute "_finish"  [attr-defined]' in done.stdout, done.stdout
    assert 'Too many arguments for "submit" of "Scheduler"  [call-arg]' in done.stdout, done.stdout
