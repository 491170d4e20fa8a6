"""Prompt text from files and standard input: readable, UTF-8, one clear error line otherwise.
(Every generation setting is checked in core/request.py.)"""

from __future__ import annotations

from specfill.core import ConfigError
from specfill.core.errors import quote


def read_prompt_file(path: str, what: str = "--prompt-file") -> str:
    """A prompt file's text: readable (a pipe such as <(...) works too) and UTF-8, else one ConfigError line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {quote(path)}: {err.strerror}") from None
    return decode_utf8(data, f"{what} {path}")


def decode_utf8(data: bytes, source: str) -> str:
    """Prompt bytes as text; anything but UTF-8 is one ConfigError line naming `source`."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source} is not UTF-8 text (invalid byte at offset {err.start})") from None
