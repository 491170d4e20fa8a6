"""The package layout, read from its one list: pyproject.toml's [tool.setuptools] (package-dir maps
each folder at the repository root to the package it is installed as; packages names every package
setuptools installs). The layout, import, style and type tests read it here; tests/test_layout.py
checks the list against the folders on disk.

Read with tomllib (Python 3.11+), else tomli where installed, else `parse_setuptools` below: the
two keys as pyproject.toml writes them (Python 3.10 without tomli; tests/test_layout.py holds it
to tomllib's reading)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def parse_setuptools(text: str) -> dict[str, Any]:
    """[tool.setuptools]'s package-dir (an inline table of strings) and packages (an array of
    strings) read without a TOML library."""
    _, found, rest = text.partition("\n[tool.setuptools]\n")
    if not found:
        raise ValueError("pyproject.toml has no [tool.setuptools] table")
    section = re.split(r"^\[", rest, maxsplit=1, flags=re.M)[0]
    table = re.search(r"^package-dir\s*=\s*\{(.*?)\}", section, re.M | re.S)
    array = re.search(r"^packages\s*=\s*\[(.*?)\]", section, re.M | re.S)
    if table is None or array is None:
        raise ValueError("[tool.setuptools] needs package-dir = { ... } and packages = [ ... ]")
    return {
        "package-dir": dict(re.findall(r'"([^"]+)"\s*=\s*"([^"]+)"', table.group(1))),
        "packages": re.findall(r'"([^"]+)"', array.group(1)),
    }


def read_setuptools(text: str) -> dict[str, Any]:
    """pyproject.toml's [tool.setuptools] table."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return parse_setuptools(text)
    return tomllib.loads(text)["tool"]["setuptools"]


SETUPTOOLS = read_setuptools(PYPROJECT.read_text(encoding="utf-8"))
# A folder at the root -> the package it is installed as ({"specfill": "specfill", "core": "specfill.core", ...})
PACKAGE_DIRS: dict[str, str] = {folder: package for package, folder in SETUPTOOLS["package-dir"].items()}
# The product's folders (the top-level ones the package is made of), in pyproject's order.
PRODUCT_FOLDERS: tuple[str, ...] = tuple(PACKAGE_DIRS)
# Every package setuptools installs, as pyproject lists them.
PACKAGES: tuple[str, ...] = tuple(SETUPTOOLS["packages"])


def packages_on_disk() -> set[str]:
    """Every folder under the product's folders that holds an __init__.py, named as installed."""
    found = set()
    for folder, package in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    return found
