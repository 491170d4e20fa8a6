"""The core stays backend-free, the package list (pyproject.toml's, the one list: tests/package_layout.py)
names every package folder and each imports, and the product stays apart from research/."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.package_layout import PACKAGES, PRODUCT_FOLDERS, PYPROJECT, ROOT, packages_on_disk, parse_setuptools


def test_core_imports_no_backend():
    code = (
        "import specfill.core, specfill.core.reference, specfill.core.methods.h2o, "
        "specfill.core.methods.specprefill, specfill.core.driver, sys; "
        "bad = {'torch', 'mlx', 'mlx.core'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_package_list_names_every_package_folder():
    """pyproject.toml's packages (what setuptools installs) are the folders with an __init__.py under
    its package-dir folders: a new sub-package left off the list would be missing from a wheel."""
    on_disk, listed = packages_on_disk(), set(PACKAGES)
    assert on_disk == listed, {"not listed": sorted(on_disk - listed), "no such folder": sorted(listed - on_disk)}
    assert len(PACKAGES) == len(listed), "a package is listed twice"


def test_the_fallback_reader_reads_the_list_as_tomllib_does():
    """tests/package_layout.py's reader for Python 3.10 without tomli gives tomllib's package-dir and packages."""
    tomllib = pytest.importorskip("tomllib")
    text = PYPROJECT.read_text(encoding="utf-8")
    want = tomllib.loads(text)["tool"]["setuptools"]
    assert parse_setuptools(text) == {"package-dir": want["package-dir"], "packages": want["packages"]}


def test_every_listed_package_imports():
    """Each package of the list imports (one that needs an optional library missing here, torch,
    Triton, MLX, is passed over; on the suite's machine all are installed)."""
    for name in PACKAGES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or error.name.split(".")[0] == "specfill":
                raise


def test_core_io_imports_run_one_way():
    """random_model needs neither weights nor tokenizer (both import it); weights no tokenizer."""
    code = (
        "import sys, specfill.core.io.random_model; "
        "loaded = {'specfill.core.io.weights', 'specfill.core.io.tokenizer'} & set(sys.modules); "
        "assert not loaded, loaded; import specfill.core.io.weights; "
        "assert 'specfill.core.io.tokenizer' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_method_is_written_once():
    """Same-named backend modules share under 30% of their lines once the array library's prefix
    is masked (tests/backend_similarity.py): the orchestration lives in core/, once."""
    from tests.backend_similarity import pairs

    similar = [(name, round(ratio, 3)) for name, ratio in pairs() if ratio >= 0.30]
    assert not similar, similar


def test_readme_is_a_front_page():
    """README: the two set-up commands first (CI runs `make test`), under 200 lines, links that resolve."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < 200, len(lines)
    assert lines[3].startswith("make demo") and lines[4].startswith("make test"), lines[:5]
    for page in ("methods", "usage", "serve", "backends", "results", "development"):
        assert (ROOT / "docs" / f"{page}.md").is_file() and f"docs/{page}.md" in text, page


def test_results_index_lists_every_results_file():
    """docs/results_index.md is regenerated whenever a file under results/ is added or removed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "results_index.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_results_index_leaves_out_what_git_ignores(tmp_path, monkeypatch):
    """A run's local prompt cache under results/ (git-ignored) is not indexed: the index a clean clone
    checks must read as this checkout's (CI once failed on a cache folder only the run's machine held)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_index", ROOT / "scripts" / "results_index.py")
    index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(index)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("results/*_cache/\n")
    (tmp_path / "results" / "run_cache").mkdir(parents=True)
    (tmp_path / "results" / "run_cache" / "k.safetensors").write_bytes(b"x")
    (tmp_path / "results" / "run.md").write_text("# A run\n")
    monkeypatch.setattr(index, "ROOT", tmp_path)
    text = index.render()
    assert "run.md" in text and "A run" in text
    assert "run_cache" not in text and "k.safetensors" not in text


PRODUCT = (*PRODUCT_FOLDERS, "scripts", "tests")  # the package's folders, its tools and its tests


def _imports_and_path_entries(path: Path) -> tuple[list[str], list[str]]:
    """The modules a file imports, and the source of what it adds to sys.path (insert / append)."""
    text = path.read_text(encoding="utf-8")
    imports, entries = [], []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imports += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append(node.module or "")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("insert", "append")
            and ast.get_source_segment(text, node.func.value) == "sys.path"
        ):
            entries.append(ast.get_source_segment(text, node.args[-1]))
    return imports, entries


def test_research_stays_apart_from_the_product():
    """research/ (one-off studies, their scripts and results) is never imported or put on sys.path
    by the product, its tools or its tests; a study imports `specfill` like any user and puts only
    its own folder or a sibling study's on sys.path, no product folder (research/README.md)."""
    offenders = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            imports, entries = _imports_and_path_entries(path)
            offenders += [f"{path.relative_to(ROOT)}: import {n}" for n in imports if n.split(".")[0] == "research"]
            offenders += [f"{path.relative_to(ROOT)}: sys.path {e}" for e in entries if "research" in e]
    inside_research = ("Path(__file__).parent", "Path(__file__).resolve().parent)", "parents[1] / ", '"research"')
    for path in sorted((ROOT / "research").rglob("*.py")):
        _, entries = _imports_and_path_entries(path)
        offenders += [
            f"{path.relative_to(ROOT)}: sys.path {e}" for e in entries if not any(mark in e for mark in inside_research)
        ]
    assert not offenders, offenders
    studies = [
        p.name for p in (ROOT / "scripts").iterdir() if p.name.startswith(("bench_", "profile_", "peer_", "check_"))
    ]
    assert not studies, f"one-off benchmarks and studies go to research/: {studies}"


# Modules that may import specfill.conformance: the suite itself, its CLI subcommand, each backend's
# adapter for it, and doctor (which runs the suite on the user's machine).
CONFORMANCE_USERS = {
    "conformance",
    "cli/conformance.py",
    "backends/mlx/conformance.py",
    "backends/torch_cuda/conformance.py",
    "evaluation/doctor.py",
}


def test_no_production_module_imports_conformance():
    """The kernels' first-use self-check is a runtime feature (core/self_check.py): production code
    never reaches into the test suite."""
    offenders = []
    for folder in PRODUCT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.split("/")[0] in CONFORMANCE_USERS or rel in CONFORMANCE_USERS:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                offenders += [f"{rel}: {n}" for n in names if n.startswith("specfill.conformance")]
    assert not offenders, offenders


def test_generate_loads_only_what_it_uses():
    """`specfill generate` imports its own subcommand only: no other subcommand, no evaluation,
    conformance or NumPy oracle, and a full prefill none of the methods' modules, kernels or
    self-check (96 specfill modules at 8afab58, 65 before the kernels were imported on first use,
    44 after; 46 now that the backend contract has its module, core/backend.py, and the torch
    backend's load code left its package __init__ for loader.py; 47 with core/cpu.py, which the
    default dtype reads; 48 with core/config_checks.py, the settings' checks config.py calls; 49 with
    specfill/generation.py, the generation path the API's Session builds on, out of api.py (api.py
    with the Session outgrew one module's 450 lines); 50 with core/plan.py, a generation's plan out of
    the driver: docs/development.md; 51 with backends/torch_cuda/fused.py, when the decoder's fused
    RoPE and RMSNorm kernels run: a small module of gates, the kernels themselves still loaded on a GPU's
    first use only)."""
    code = (
        "import sys; from specfill.cli.main import main; "
        "rc = main(['generate', '--backend', 'cuda', '--model', 'random:tiny-llama', '--prompt', 'hi', "
        "'--max-tokens', '2']); print(rc, ' '.join(m for m in sys.modules if m.startswith('specfill')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rc, _, names = done.stdout.strip().splitlines()[-1].partition(" ")
    loaded = names.split()
    assert rc == "0", done.stderr
    unwanted = [
        m
        for m in loaded
        if m.startswith(("specfill.evaluation", "specfill.conformance", "specfill.core.reference", "specfill.serve"))
        or (m.startswith("specfill.cli.") and m.split(".")[2] not in ("main", "generate", "options", "progress"))
    ]
    assert not unwanted, unwanted
    lazy = [
        m
        for m in loaded
        if m.startswith(
            (
                "specfill.backends.torch_cuda.kernels",
                "specfill.core.self_check",
                "specfill.core.methods.h2o",
                "specfill.core.methods.specprefill",
                "specfill.core.probe",
                "specfill.backends.torch_cuda.adapted",
            )
        )
    ]
    assert not lazy, lazy
    assert len(loaded) <= 51, len(loaded)


def test_production_files_stay_under_500_lines():
    """Files go by responsibility, not by a line cap (the 260-line cap split concepts across files,
    issue 35; the 450 one split the configs from their layer grammar and drafting's sources from
    their rounds, and a request's walk went back and forth between them, issue 49): up to ~450
    lines where one concept needs it (ruff-formatted, line length 120); 500 flags a module that
    has grown to hold more than one (tests may run longer)."""
    long = [
        f"{path.relative_to(ROOT)}: {n}"
        for folder in (*PRODUCT_FOLDERS, "scripts")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 500
    ]
    assert not long, long


# Where a backend's objects reach the core, the API, the server and the evaluation tools: they ask
# them by type (core/runtime.py's RecurrentCache, core/backend.py's ProcessGroup and Backend), never
# by probing an attribute. A probe is any hasattr(...) and any getattr(x, "name", ...) naming its
# attribute by a literal (getattr(self, name) over a list of field names is reflection, not a probe).
PROBE_FREE = ("core", "specfill/serve", "specfill/api.py", "evaluation")
# (file, object, attribute) -> why it is no backend object: each probe that stays, with its reason.
PROBES_ALLOWED = {
    ("core/cpu.py", "os", "sched_getaffinity"): "a module: the platform has it or not (Linux only)",
    ("specfill/serve/plan.py", "request", "max_completion_tokens"): "an HTTP request model: chat's has it",
    ("specfill/serve/segments.py", "request", "protect"): "an HTTP request model: not every endpoint's has it",
    ("specfill/serve/system_turns.py", "tokenizer", "chat_template"): "a tokenizer: a base model's has none",
    ("specfill/serve/runner.py", "connection", "transport"): "uvicorn's connection: not every protocol's has one",
    ("specfill/serve/tool_mlx.py", "module", "parse_tool_call"): "a module: mlx-lm's tool parser, if it has one",
}


def attribute_probes(source: str) -> list[tuple[str, str, int]]:
    """(object, attribute or "*" when computed, line) of every hasattr / literal-named getattr call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "*"
        if node.func.id == "hasattr" or (node.func.id == "getattr" and name != "*"):
            found.append((ast.unparse(node.args[0]), str(name), node.lineno))
    return found


def test_no_attribute_probes_outside_backends():
    """The core, the API, the server and the evaluation tools probe no object's attributes (a
    hybrid's cache was found by hasattr(cache, "mark"), a sharded model by getattr(model,
    "distributed", None)) but the allowed few above, each a module, a config or a request model."""
    root = Path(__file__).resolve().parents[1]
    offenders, seen = [], set()
    for entry in PROBE_FREE:
        for path in sorted((root / entry).rglob("*.py")) if (root / entry).is_dir() else [root / entry]:
            rel = path.relative_to(root).as_posix()
            for obj, name, line in attribute_probes(path.read_text(encoding="utf-8")):
                key = (rel, obj, name)
                if key in PROBES_ALLOWED:
                    seen.add(key)
                else:
                    offenders.append(f"{rel}:{line}: {obj}.{name}")
    assert not offenders, "ask a backend's object by type (core/runtime.py, core/backend.py), not by probe: " + str(
        offenders
    )
    assert seen == set(PROBES_ALLOWED), f"allowed probes no longer there: {set(PROBES_ALLOWED) - seen}"


def _specfill_imports(path: Path, package: str) -> list[str]:
    """The specfill modules a file of `package` imports (relative imports resolved), lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [module] + [f"{module}.{a.name}" for a in node.names]
    return found


@pytest.mark.parametrize(
    "folder,forbidden",
    [("core/reference", "specfill.core.methods"), ("core/methods", "specfill.core.reference")],
)
def test_the_spec_and_the_methods_import_each_other_nowhere(folder, forbidden):
    """The reference (the spec) imports no method and the methods never call the reference: what both
    need lives in core/ proper (the H2O walk: core/h2o_walk.py); production selection is
    core/methods/selection.py, the spec's own core/reference/specprefill.py (issue 49)."""
    package = "specfill." + folder.replace("/", ".")
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / folder).glob("*.py"))
        for name in _specfill_imports(path, package)
        if name == forbidden or name.startswith(forbidden + ".")
    ]
    assert not offenders, offenders
