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
