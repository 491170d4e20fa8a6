"""No import circles among the product modules (issue 35): read with `ast`, every import counts,
at module level, inside a function (a lazy import) or under TYPE_CHECKING.

The modules are named as installed (pyproject's package-dir mapping, read by tests/package_layout.py:
core/ is specfill.core, and so on). An edge A -> B is one import statement of A naming B:
  import B / import B as x            -> B
  from B import name                  -> B (its namespace is read), and B.name when that is a module
  from . import name (in package P)   -> P and P.name: a module importing its own package's
                                         __init__ counts
Parent packages a statement imports on the way (specfill.core before specfill.core.config) are
not edges: Python runs them first whoever asks, and a package's __init__ re-exporting its
modules (core/__init__.py) is then no circle with them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.package_layout import PACKAGE_DIRS, ROOT

# Cycles allowed, each with its reason: none.
EXEMPT: dict[tuple[str, ...], str] = {}


def module_files() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package __init__)."""
    modules = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join((package, *(parts[:-1] if is_package else parts)))
            modules[name] = (path, is_package)
    return modules


def imports_of(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The product modules one module's import statements name (see the module docstring)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return {target for target in found if target in known and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    known = set(modules)
    return {name: imports_of(name, path, is_package, known) for name, (path, is_package) in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycle each back edge of a depth-first search (in a fixed order) closes, as a path with
    its first module repeated at the end."""
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        stack, on_path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.pop()
                done.add(node)
            elif child in on_path:
                cycle = on_path[on_path.index(child) :] + [child]
                if tuple(cycle) not in EXEMPT:
                    cycles.append(cycle)
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                on_path.append(child)
    return cycles


def test_the_graph_sees_every_kind_of_import():
    """The reader resolves relative, absolute, lazy and TYPE_CHECKING imports (so the test below
    can fail): a few edges known to exist in the product."""
    graph = import_graph()
    assert "specfill.core.config" in graph["specfill.core"]  # from .config import ... in an __init__
    assert "specfill.core.driver" in graph["specfill.api"]  # from specfill.core.driver import ..., TYPE_CHECKING
    assert "specfill.core.io.hub" in graph["specfill.api"]  # inside load(): a lazy import
    assert "specfill.core.stages" in graph["specfill.core.reference.model"]  # from ..stages import ...
    # from . import h2o: the package's __init__ and the module
    assert {"specfill.core.reference", "specfill.core.reference.h2o"} <= graph["specfill.core.reference.model"]
    # import specfill.backends.torch_cuda.placement as placement: the module only
    assert "specfill.backends.torch_cuda.placement" in graph["specfill.backends.torch_cuda.ops"]
    assert "specfill.backends.torch_cuda" not in graph["specfill.backends.torch_cuda.ops"]


def test_find_cycles_reports_the_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_method_module_imports_the_driver():
    """core/methods/ is written over the ops protocol; the driver calls the methods, never back."""
    graph = import_graph()
    offenders = sorted(
        name
        for name, targets in graph.items()
        if name.startswith("specfill.core.methods") and "specfill.core.driver" in targets
    )
    assert not offenders, offenders


def test_exemptions_are_real_cycles():
    graph = import_graph()
    for cycle in EXEMPT:
        assert all(b in graph[a] for a, b in zip(cycle, cycle[1:])), cycle
