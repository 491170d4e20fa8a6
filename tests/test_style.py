"""ruff keeps the product, its tools and its tests in one style: `ruff check` (pycodestyle errors and
warnings, pyflakes, import order; line length 120) and `ruff format --check` over the folders
below, configured in pyproject.toml ([tool.ruff]). research/ keeps its studies as they were written."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["core", "backends", "cli", "conformance", "evaluation", "specfill", "scripts", "tests"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    done = ruff("check", "--no-cache", "--output-format", "concise")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_applied():
    done = ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, "run `ruff format " + " ".join(FOLDERS) + "`:\n" + done.stdout + done.stderr
