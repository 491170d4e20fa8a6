"""mlx-lm's tool-call parsers (`mlx_lm/tool_parsers/`), read as specfill's calls.

mlx-lm is an optional dependency. Each of its parser modules is self-contained (json, ast and the
`regex` package) and names its markers (`tool_call_start`, `tool_call_end`) and a
`parse_tool_call(text, tools)` that returns one {"name", "arguments"} object or a list of them,
and raises (any exception) on text it cannot read. Importing `mlx_lm.tool_parsers.X` the ordinary
way first runs `mlx_lm/__init__.py`, which imports MLX and transformers (seconds, and a process
on the CUDA backend would never need them): so, unless `mlx_lm` is imported already, the modules
are loaded from their folder as the package `specfill_mlx_lm_tool_parsers`, which runs none of
that; if that fails, the ordinary import is used.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any, Sequence

from .tool_calls import ToolCall, as_call

ALIAS = "specfill_mlx_lm_tool_parsers"


class MissingParser(Exception):
    """mlx-lm is not installed, or its version has no parser of this name (the message says which)."""


@functools.lru_cache(maxsize=None)
def _package() -> str | None:
    """The name mlx-lm's tool_parsers package is imported under here (None: mlx-lm is not installed)."""
    if "mlx_lm" in sys.modules:
        return "mlx_lm.tool_parsers"
    try:
        spec = importlib.util.find_spec("mlx_lm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        init = f"{root}/tool_parsers/__init__.py"
        try:
            package_spec = importlib.util.spec_from_file_location(
                ALIAS, init, submodule_search_locations=[f"{root}/tool_parsers"]
            )
            if package_spec is None or package_spec.loader is None:
                continue
            package = importlib.util.module_from_spec(package_spec)
            sys.modules[ALIAS] = package
            package_spec.loader.exec_module(package)
            return ALIAS
        except (OSError, ImportError):
            sys.modules.pop(ALIAS, None)
    return "mlx_lm.tool_parsers"


def mlx_available() -> bool:
    """Whether mlx-lm is installed (its parsers can be loaded)."""
    return _package() is not None


@functools.lru_cache(maxsize=None)
def mlx_parser(name: str) -> ModuleType:
    """mlx-lm's parser module `name` (MissingParser: mlx-lm is missing, or has no such parser)."""
    package = _package()
    if package is None:
        raise MissingParser("mlx-lm is not installed (pip install mlx-lm)")
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError:
        module = None
    except ImportError:  # the private load broke (a parser importing mlx_lm itself): the ordinary way
        module = None
        if package != "mlx_lm.tool_parsers":
            try:
                module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
            except ImportError:
                module = None
    if module is None or not callable(getattr(module, "parse_tool_call", None)):
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("mlx-lm")
        except PackageNotFoundError:
            installed = "?"
        raise MissingParser(f"mlx-lm {installed} has no '{name}' tool parser (pip install -U mlx-lm)")
    return module


def markers(name: str) -> tuple[str, str | None]:
    """(the marker that opens a call, the one that closes it or None) as mlx-lm's parser names them."""
    module = mlx_parser(name)
    return module.tool_call_start, module.tool_call_end or None


def mlx_read(name: str, text: str, tools: Sequence[dict[str, Any]] = ()) -> list[ToolCall]:
    """The calls mlx-lm's parser `name` reads in the text between a call's markers; ValueError when it
    reads none, or names a function that is not one of `tools` (when there are tools: some parsers
    fall back to a made-up name, glm47's "unknown")."""
    try:
        found = mlx_parser(name).parse_tool_call(text, list(tools) or None)
    except MissingParser:
        raise
    except Exception as err:  # noqa: BLE001 - a parser's way of saying no is any exception
        raise ValueError(f"mlx-lm's {name} parser read no call: {err}") from None
    calls = [as_call(c) for c in (found if isinstance(found, list) else [found])]
    names = {t["function"]["name"] for t in tools}
    if not calls or (names and any(c.name not in names for c in calls)):
        raise ValueError(f"mlx-lm's {name} parser read no call to one of the request's tools")
    return calls
