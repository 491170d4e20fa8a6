"""The core stays backend-free, and every promised package imports."""
import importlib
import subprocess
import sys
from pathlib import Path


def test_core_imports_no_backend():
    code = ("import specfill.core, specfill.core.reference, specfill.core.methods.h2o, "
            "specfill.core.methods.specprefill, specfill.core.driver, sys; "
            "bad = {'torch', 'mlx', 'mlx.core'} & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_promised_packages_import():
    for name in ("specfill.core", "specfill.core.io", "specfill.backends.mlx", "specfill.backends.torch_cuda",
                 "specfill.conformance", "specfill.cli"):
        importlib.import_module(name)


def test_core_io_imports_run_one_way():
    """random_model needs neither weights nor tokenizer (both import it); weights no tokenizer."""
    code = ("import sys, specfill.core.io.random_model; "
            "loaded = {'specfill.core.io.weights', 'specfill.core.io.tokenizer'} & set(sys.modules); "
            "assert not loaded, loaded; import specfill.core.io.weights; "
            "assert 'specfill.core.io.tokenizer' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_method_is_written_once():
    """Same-named backend modules share under 30% of their lines once the array library's prefix
    is masked (scripts/backend_similarity.py): the orchestration lives in core/, once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        from backend_similarity import pairs
    finally:
        sys.path.pop(0)
    similar = [(name, round(ratio, 3)) for name, ratio in pairs() if ratio >= 0.30]
    assert not similar, similar


ROOT = Path(__file__).resolve().parents[1]


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
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_index.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
