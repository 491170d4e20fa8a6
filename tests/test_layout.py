"""The core stays backend-free, and every promised package imports."""
import importlib
import subprocess
import sys


def test_core_imports_no_backend():
    code = ("import specfill.core, specfill.core.reference, specfill.core.methods.h2o, "
            "specfill.core.methods.specprefill, specfill.core.driver, sys; "
            "bad = {'torch', 'mlx', 'mlx.core'} & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_promised_packages_import():
    for name in ("specfill.core", "specfill.backends.mlx", "specfill.backends.torch_cuda",
                 "specfill.conformance", "specfill.cli"):
        importlib.import_module(name)
