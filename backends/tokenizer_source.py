"""The directory a Hugging Face tokenizer was read from, for both backends' adapted loaders: a
(model, tokenizer) pair from another library brings no path, and specfill reads its own tokenizer
from the tokenizer's directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specfill.core.errors import ModelLoadError


def tokenizer_directory(tokenizer: Any, remedy: str) -> Path:
    """The directory a transformers tokenizer was read from, or ModelLoadError ending in `remedy`
    (what to pass instead, in the library's own words)."""
    from transformers import PreTrainedTokenizerBase

    source = Path(tokenizer.name_or_path) if isinstance(tokenizer, PreTrainedTokenizerBase) else None
    if source is None or not source.is_dir():
        raise ModelLoadError(
            f"cannot find the directory the tokenizer ({type(tokenizer).__name__}) was read from: {remedy}"
        )
    return source
