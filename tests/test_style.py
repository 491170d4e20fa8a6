"""ruff keeps the product, its tools and its tests in one style: `ruff check` (pycodestyle errors and
warnings, pyflakes, import order; line length 120) and `ruff format --check` over the folders
below (the product's, from pyproject.toml's package-dir, its tools and its tests), configured in
pyproject.toml ([tool.ruff]). research/ keeps its studies as they were written."""

import subprocess
import sys

from tests.package_layout import PRODUCT_FOLDERS, ROOT

FOLDERS = [*PRODUCT_FOLDERS, "scripts", "tests"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    done = ruff("check", "--no-cache", "--output-format", "concise")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_applied():
    done = ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, "run `ruff format " + " ".join(FOLDERS) + "`:\n" + done.stdout + done.stderr
