"""Every error is one line: user-given paths and strings appear quoted and escaped (core/errors.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specfill.core.errors import ConfigError, ModelLoadError, one_line, quote


def test_quote_and_one_line_escape_what_is_not_printable():
    assert quote("a\nb.gguf") == "'a\\nb.gguf'" and quote("é.gguf") == "'é.gguf'"
    assert one_line("x\ny\tz\x1b[31m") == "x\\ny\\tz\\x1b[31m"
    assert str(ConfigError("bad\nvalue")) == "bad\\nvalue"  # even an unquoted value cannot split a message


@pytest.mark.parametrize("name", ["evil\nspecfill: error: forged.gguf", "tab\there.gguf", "ctrl\x1b[2J.gguf"])
def test_a_model_path_with_control_characters_is_one_quoted_line(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"not a gguf at all, long enough to have a header")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specfill",
            "generate",
            "--backend",
            "cuda",
            "--model",
            str(path),
            "--prompt",
            "hi",
            "--max-tokens",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("specfill: no CUDA GPU")]
    assert len(lines) == 1 and lines[0].startswith("specfill: error: "), done.stderr
    assert quote(path) in lines[0], lines[0]


def test_a_missing_path_is_named_quoted(tmp_path):
    from specfill.core.io.weights import load_weights

    with pytest.raises(ModelLoadError) as err:
        load_weights(tmp_path / "no\nsuch.gguf")
    assert "\n" not in str(err.value) and quote(tmp_path / "no\nsuch.gguf") in str(err.value)
